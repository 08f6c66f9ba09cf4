"""The realtime WebSocket against a live server with the fake backend (spec §11 items 1-8, 10)."""

from __future__ import annotations

import asyncio
import base64
import io
import time

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.integration.realtime.conftest import LOST_SESSION_SEED
from tests.integration.realtime.helpers import ExpectedFrames, Session, connect

STATS_KEYS = {
    "type", "trace_id", "session_id", "request_id", "chunk_index", "event_id",
    "request_prepare_ms", "scheduler_forward_ms", "pace_wait_ms", "header_write_ms",
    "raw_payload_build_ms", "raw_write_ms", "ws_write_ms", "chunk_total_ms", "num_batches",
    "num_frames", "raw_bytes", "ws_payload_bytes", "content_type", "gpu_queue_ms",
}
HEADER_KEYS = {
    "type", "request_id", "chunk_index", "content_type", "num_frames", "total_size",
    "frame_batch_index", "num_frame_batches", "is_final_frame_batch", "format", "width",
    "height", "channels", "bytes_per_frame", "encoding", "raw_size",
}


def init(prompt="a quiet valley", **extra):
    return {"type": "init", "prompt": prompt, **extra}


async def test_raw_default_is_header_plus_one_binary_message(rt_server):
    async with connect(rt_server, "trace_id=t-1") as ws:
        session = Session(ws)
        await session.send(init(max_chunks=1))
        header = await session.recv_map()
        assert header["type"] == "frame_batch_header" and "payload" not in header
        assert HEADER_KEYS <= set(header) and "event_id" not in header
        assert (header["width"], header["height"], header["num_frames"]) == (832, 480, 12)
        assert header["total_size"] == 14_376_960 == header["raw_size"]
        payload = await ws.recv()
        assert isinstance(payload, bytes) and len(payload) == 14_376_960
        frames = np.frombuffer(payload, np.uint8).reshape(12, 480, 832, 3)
        assert np.array_equal(frames, ExpectedFrames("a quiet valley").chunk())
        stats = await session.recv_map()
        assert stats["type"] == "chunk_stats" and STATS_KEYS <= set(stats)
        assert stats["trace_id"] == "t-1" and stats["event_id"] is None
        assert stats["raw_bytes"] == 14_376_960 and stats["num_batches"] == 1
        assert stats["session_id"].startswith("sess-") and header["request_id"].startswith(
            stats["session_id"] + "_")
        code, reason, _ = await session.wait_close()
    assert (code, reason) == (1000, "generation complete")


async def test_small_chunk_is_one_frame_batch(rt_server):
    async with connect(rt_server) as ws:
        session = Session(ws)
        await session.send(init(size="32x32", max_chunks=1))
        msg = await session.recv_map()
        assert msg["type"] == "frame_batch" and len(msg["payload"]) == 12 * 32 * 32 * 3
        assert msg["total_size"] == len(msg["payload"])


@pytest.mark.parametrize("fmt", ["jpeg", "webp"])
async def test_previews_are_batches_of_six_scaled(rt_server, fmt):
    async with connect(rt_server) as ws:
        session = Session(ws)
        await session.send(init(size="64x48", max_chunks=1, realtime_output_format=fmt,
                                realtime_preview_max_width=32))
        chunks, code, _ = await session.read_until_close()
    [chunk] = chunks
    assert code == 1000 and [h["num_frames"] for h in chunk.headers] == [6, 6]
    for h in chunk.headers:
        assert sum(h["payload_lengths"]) == h["total_size"]
        assert (h["preview_width"], h["preview_height"], h["source_width"]) == (32, 24, 64)
        assert h["content_type"] == f"image/{fmt}"
    assert chunk.frames.shape == (12, 24, 32, 3)


@pytest.mark.parametrize("fmt", ["delta-gzip", "delta-zstd"])
async def test_delta_encodings_decode_bit_exactly(rt_server, fmt):
    expected = ExpectedFrames("delta", width=64, height=64)
    async with connect(rt_server) as ws:
        session = Session(ws)
        await session.send(init("delta", size="64x64", max_chunks=3, realtime_output_format=fmt,
                                condition_inputs={"action": "d-14,w-4"}))
        chunks, code, reason = await session.read_until_close()
    assert (code, reason) == (1000, "generation complete")
    script = [["d"]] * 14 + [["w"]] * 4 + [[]] * 18
    for i, chunk in enumerate(chunks):
        assert np.array_equal(chunk.frames, expected.chunk(script[i * 12:(i + 1) * 12]))
        assert chunk.headers[0]["encoding"] == fmt
        assert ("delta_reference" in chunk.headers[0]) == (i > 0)


async def test_invalid_inits_then_valid_init_on_same_socket(rt_server):
    async with connect(rt_server) as ws:
        session = Session(ws)
        await ws.send("not msgpack")  # text messages are invalid
        await ws.send(b"\xc1")  # not msgpack
        await session.send(init(output_path="/tmp/x.mp4"))
        await session.send(init(first_frame="https://example.com/a.png"))
        await session.send(init(first_frame="/etc/passwd"))
        await session.send(init(size="65x64"))
        for _ in range(6):
            err = await session.recv_map()
            assert err["type"] == "error" and err["content"] == "invalid generate request"
            assert err["code"] == "invalid_init" and err["detail"]
        await session.send(init(size="32x32", max_chunks=1, unknown_adapter_key=True))
        chunks, code, _ = await session.read_until_close()
    assert len(chunks) == 1 and code == 1000


async def test_eight_invalid_inits_close_1008(rt_server):
    async with connect(rt_server) as ws:
        session = Session(ws)
        for _ in range(8):
            await session.send({"type": "init"})
        code, reason, seen = await session.wait_close()
    assert [m["content"] for m in seen] == ["invalid generate request"] * 8
    assert (code, reason) == (1008, "no valid init")


async def test_script_padding_and_state_pulse(rt_server):
    expected = ExpectedFrames("pulse", width=32, height=32)
    async with connect(rt_server) as ws:
        session = Session(ws)
        await session.send(init("pulse", size="32x32", max_chunks=5,
                                condition_inputs={"camera_actions": [["d"]] * 5}))
        first = await session.read_chunk()
        assert np.array_equal(first.frames, expected.chunk([["d"]] * 5 + [[]] * 7))
        transitions = [{"actions": ["w"], "client_ts_ms": 0}, {"actions": [], "client_ts_ms": 90}]
        await session.send({"type": "event", "kind": "camera_actions", "event_id": 11,
                            "payload": {"mode": "state", "transitions": transitions}})
        chunks, code, _ = await session.read_until_close()
    assert code == 1000 and len(chunks) == 4
    pulsed = False
    for chunk in chunks:
        if chunk.stats["event_id"] == 11 and not pulsed:
            camera = [["w"]] + [[]] * 11  # min_pulse_items = 1 frame of the short press
            pulsed = True
            assert all(h["event_id"] == 11 for h in chunk.headers)
        else:
            camera = [[]] * 12  # script exhausted (padding) or state held at []
        assert np.array_equal(chunk.frames, expected.chunk(camera)), chunk.index
    assert pulsed


async def test_prompt_switch_latest_wins_and_refresh_kv(rt_server):
    expected = ExpectedFrames("first prompt", width=32, height=32)
    async with connect(rt_server) as ws:
        session = Session(ws)
        await session.send(init("first prompt", size="32x32", max_chunks=5))
        await session.read_chunk()
        expected.chunk()
        # Both arrive while the next chunk is generating: only the latest is applied.
        await session.send({"type": "event", "kind": "prompt", "payload": "discarded",
                            "event_id": 20})
        await session.send({"type": "event", "kind": "prompt", "event_id": 21,
                            "payload": {"prompt": "second prompt", "refresh_kv": True}})
        chunks, code, _ = await session.read_until_close()
    assert code == 1000
    ids = [c.stats["event_id"] for c in chunks]
    assert 20 not in ids and ids.count(21) == 1
    for chunk in chunks:
        switched = chunk.stats["event_id"] == 21
        assert np.array_equal(chunk.frames,
                              expected.chunk(prompt="second prompt" if switched else None))
        assert ("kv_refresh_ms" in chunk.stats) == switched


async def admin_sessions(server) -> int:
    async with httpx.AsyncClient() as client:
        body = (await client.get(f"{server.base_url}/admin/stats", timeout=5)).json()
    return body["stages"]["realtime"]["sessions"]


async def test_max_chunks_closes_1000_and_releases_state(rt_server):
    async with connect(rt_server) as ws:
        session = Session(ws)
        await session.send(init(size="32x32", max_chunks=3))
        chunks, code, reason = await session.read_until_close()
    assert [c.index for c in chunks] == [0, 1, 2]
    assert (code, reason) == (1000, "generation complete")
    deadline = time.monotonic() + 5
    while await admin_sessions(rt_server) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert await admin_sessions(rt_server) == 0


async def test_client_disconnect_releases_state(rt_server):
    async with connect(rt_server) as ws:
        session = Session(ws)
        await session.send(init(size="32x32"))
        await session.read_chunk()
        assert await admin_sessions(rt_server) == 1
    deadline = time.monotonic() + 5
    while await admin_sessions(rt_server) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert await admin_sessions(rt_server) == 0


async def test_lost_session_state_is_a_generate_loop_error(rt_server):
    async with connect(rt_server) as ws:
        session = Session(ws)
        await session.send(init(size="32x32", seed=LOST_SESSION_SEED))
        code, reason, seen = await session.wait_close()
    errors = [m for m in seen if m.get("type") == "error"]
    assert len(errors) == 1 and errors[0]["code"] == "generation_error"
    assert errors[0]["content"].startswith("error during generate loop: realtime session sess-")
    assert errors[0]["content"].endswith("not found")
    assert [m["chunk_index"] for m in seen if m.get("type") == "chunk_stats"] == [0, 1]
    assert (code, reason) == (1011, "generation error")


async def test_invalid_events_keep_the_session_going(rt_server):
    async with connect(rt_server) as ws:
        session = Session(ws)
        await session.send(init(size="32x32", max_chunks=4))
        await session.read_chunk()
        await ws.send("text is invalid")
        await session.send({"type": "event", "kind": "teleport", "payload": 1})
        await session.send({"type": "event", "kind": "camera_actions", "payload": [["w"]] * 513})
        await session.send({"type": "event", "kind": "heartbeat"})
        chunks, code, _ = await session.read_until_close()
    assert code == 1000 and len(chunks) == 3
    assert [e["content"] for e in session.errors] == ["invalid event"] * 3
    assert "teleport" in session.errors[1]["detail"]


async def test_concurrent_sessions_are_independent(rt_server):
    async def one(prompt, seed, action):
        expected = ExpectedFrames(prompt, seed=seed, width=48, height=32)
        async with connect(rt_server) as ws:
            session = Session(ws)
            await session.send(init(prompt, seed=seed, size="48x32", max_chunks=3,
                                    realtime_output_format="delta-zstd",
                                    condition_inputs={"action": action}))
            chunks, code, _ = await session.read_until_close()
        script = [[k] for k in action.split("-")[0]] * int(action.split("-")[1])
        script += [[]] * (36 - len(script))
        assert code == 1000 and len(chunks) == 3
        for i, chunk in enumerate(chunks):
            assert np.array_equal(chunk.frames, expected.chunk(script[i * 12:(i + 1) * 12]))
        return {c.stats["session_id"] for c in chunks}

    ids = await asyncio.gather(one("north", 1, "w-20"), one("east", 2, "l-30"),
                               one("south", 3, "a-7"))
    assert len(set.union(*ids)) == 3


async def test_first_frame_as_data_url(rt_server):
    img = Image.new("RGB", (16, 16), (30, 60, 90))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    data_url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    async with connect(rt_server) as ws:
        session = Session(ws)
        await session.send(init("framed", size="32x32", max_chunks=1, first_frame=data_url))
        chunks, code, _ = await session.read_until_close()
    expected = ExpectedFrames("framed", width=32, height=32, first_frame_mean=60)
    assert code == 1000 and np.array_equal(chunks[0].frames, expected.chunk())


async def test_api_process_loads_no_model_library(rt_server):
    async with connect(rt_server) as ws:
        session = Session(ws)
        await session.send(init(size="32x32", max_chunks=1, realtime_output_format="webp"))
        await session.read_until_close()
    maps = open(f"/proc/{rt_server.proc.pid}/maps").read()
    assert "libtorch" not in maps and "/torch/" not in maps
