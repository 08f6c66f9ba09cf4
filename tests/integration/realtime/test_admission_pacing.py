"""Admission, watchdog, pacing, camera-less, unsupported pipelines (spec §1, §7, §8, §11)."""

from __future__ import annotations

import asyncio
import time
from typing import Iterator

import pytest

from tests.integration.realtime.helpers import Session, connect, start_fake_server
from tests.support.server import ServerProcess


@pytest.fixture(scope="module")
def tight_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One slot, 1.5 s admission wait, 2 s idle timeout, 3.5 s lifetime, no camera conditioning."""
    server = start_fake_server(
        tmp_path_factory.mktemp("rt-tight"),
        max_sessions=1,
        admission_wait_s=1.5,
        idle_timeout_s=2.0,
        max_lifetime_s=3.5,
        server_args_overrides={"fake_camera": False, "fake_forward_ms": 20},
    )
    yield server
    server.stop()


def init(**extra):
    return {"type": "init", "prompt": "p", "size": "32x32", **extra}


async def heartbeats(session: Session, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await session.send({"type": "event", "kind": "heartbeat"})
        await asyncio.sleep(0.3)


async def test_second_client_waits_then_capacity_exhausted(tight_server):
    async with connect(tight_server, "user_id=alice") as first_ws:
        first = Session(first_ws)
        await first.send(init(realtime_output_pacing=True))  # 750 ms per chunk: no flood
        await first.read_chunk()
        async with connect(tight_server, "user_id=bob") as second_ws:
            second = Session(second_ws)
            started = time.monotonic()
            await second.send(init())
            code, reason, seen = await second.wait_close()
            waited = time.monotonic() - started
    assert waited >= 1.4
    [error] = seen
    assert error["content"] == "realtime admission rejected: CAPACITY_EXHAUSTED"
    assert error["code"] == "admission_rejected" and error["retry_after_s"] > 0
    assert (code, reason) == (1008, "CAPACITY_EXHAUSTED")


async def test_waiting_client_admitted_when_first_leaves(tight_server):
    async with connect(tight_server) as second_ws:
        async with connect(tight_server) as first_ws:
            first = Session(first_ws)
            await first.send(init(realtime_output_pacing=True))
            await first.read_chunk()
            second = Session(second_ws)
            await second.send(init(max_chunks=2))
            await asyncio.sleep(0.4)
        # the first client left within the wait: the second gets its chunks
        chunks, code, reason = await second.read_until_close()
    assert [c.index for c in chunks] == [0, 1] and (code, reason) == (1000, "generation complete")
    assert not second.errors


async def test_idle_timeout_closes_1000(tight_server):
    async with connect(tight_server) as ws:
        session = Session(ws)
        started = time.monotonic()
        await session.send(init())
        code, reason, _ = await session.wait_close()
    assert (code, reason) == (1000, "session idle timeout")
    assert time.monotonic() - started >= 1.9


async def test_heartbeats_keep_a_session_alive_until_its_lifetime(tight_server):
    async with connect(tight_server) as ws:
        session = Session(ws)
        started = time.monotonic()
        await session.send(init())
        stop = asyncio.Event()
        beat = asyncio.create_task(heartbeats(session, stop))
        try:
            chunks, code, reason = await session.read_until_close()
        finally:
            stop.set()
            await asyncio.gather(beat, return_exceptions=True)
    assert (code, reason) == (1000, "maximum session lifetime reached")
    assert time.monotonic() - started >= 3.4 and len(chunks) > 20  # past the 2 s idle timeout


async def test_camera_events_refused_without_camera_conditioning(tight_server):
    async with connect(tight_server) as ws:
        session = Session(ws)
        await session.send(init(condition_inputs={"action": "w-3"}))
        refused = await session.recv_map()
        assert refused["content"] == "invalid generate request" and "camera" in refused["detail"]
        await session.send(init(max_chunks=3))
        await session.read_chunk()
        await session.send({"type": "event", "kind": "camera_actions", "payload": [["w"]]})
        await session.send({"type": "event", "kind": "prompt", "payload": "still fine"})
        chunks, code, _ = await session.read_until_close()
    assert code == 1000 and len(chunks) == 2
    [error] = session.errors
    assert error["content"] == "invalid event" and "camera" in error["detail"]


async def test_pacing_spaces_chunks_and_new_event_resets_clock(rt_server):
    async with connect(rt_server) as ws:
        session = Session(ws)
        await session.send(init(max_chunks=5, fps=16, realtime_output_pacing=True))
        chunks = [await session.read_chunk(), await session.read_chunk()]
        await session.send(
            {"type": "event", "kind": "camera_actions", "payload": [["d"]], "event_id": 31}
        )
        more, code, _ = await session.read_until_close()
    chunks += more
    assert code == 1000 and len(chunks) == 5
    gaps = [b.arrived_at - a.arrived_at for a, b in zip(chunks, chunks[1:])]
    for chunk, gap in zip(chunks[1:], gaps):
        if chunk.stats["event_id"] == 31 and chunk.index == min(
            c.index for c in chunks if c.stats["event_id"] == 31
        ):
            assert gap < 0.6, gaps  # a control response is not held back by the pacer
        else:
            assert gap >= 0.7, gaps  # 12 frames at 16 fps = 750 ms
    assert any(c.stats["pace_wait_ms"] > 0 for c in chunks)
