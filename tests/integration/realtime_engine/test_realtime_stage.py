"""A real `worldserve serve` with the realtime stage (dev causal checkpoint), driven over its
ZeroMQ socket with the api's own StageClient: chunks, errors, release, concurrent sessions."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.support.server import ServerProcess
from worldserve.errors import NotFound
from worldserve.ipc.client import StageClient, ZmqStageClient
from worldserve.ipc.messages import (
    RealtimeChunk,
    RealtimeChunkResult,
    RealtimeOpen,
    RealtimeOpened,
    RealtimeRelease,
)


@pytest.fixture(scope="module")
def realtime_server(tmp_path_factory: pytest.TempPathFactory, dev_models_dir: Path):
    workdir = tmp_path_factory.mktemp("realtime-engine")
    run_dir = workdir / "run"
    run_dir.mkdir()
    # The realtime stage is on by default; the others are off to keep start-up short. Its
    # socket file lives under the run dir.
    config = {"stages": {"generation": {"enabled": False}, "reasoner": {"enabled": False}}}
    server = ServerProcess(workdir, config, env={"WORLDSERVE_RUN_DIR": str(run_dir)})
    server.wait_healthy()
    yield server, next(run_dir.glob("worldserve-*/realtime.sock"))
    server.stop()


async def _client(socket_path: Path) -> StageClient:
    client = ZmqStageClient("realtime", f"ipc://{socket_path}")
    await client.handshake(timeout_s=30)
    return client


def _chunk(session: str, k: int, **fields) -> RealtimeChunk:
    return RealtimeChunk(request_id=f"{session}-{k}", session_id=session, chunk_index=k, **fields)


async def _open(client: StageClient, session: str, **settings) -> None:
    opening = RealtimeOpen(request_id=f"{session}-open", session_id=session, prompt="a red car",
                           **settings)
    reply = await client.call(opening, timeout_s=30)
    assert isinstance(reply, RealtimeOpened) and reply.session_id == session


async def test_stage_serves_chunks_and_releases(realtime_server):
    server, socket_path = realtime_server
    client = await _client(socket_path)
    try:
        caps = client.info.capabilities
        assert client.info.model == "worldserve-dev-causal-wan"
        assert caps.realtime_supported and caps.camera_conditioning
        sizes = []
        await _open(client, "sess-a")
        for k in range(3):
            reply = await client.call(_chunk("sess-a", k, camera=[["w"]] * 12), timeout_s=60)
            assert isinstance(reply, RealtimeChunkResult)
            assert len(reply.frames) == reply.num_frames * reply.width * reply.height * 3
            sizes.append(reply.num_frames)
        assert sizes == [caps.first_chunk_frames] + [caps.frames_per_chunk] * 2
        assert (reply.width, reply.height) == (caps.default_width, caps.default_height)
        with pytest.raises(NotFound, match="realtime session ghost not found"):
            await client.call(_chunk("ghost", 1), timeout_s=30)
        released = await client.call(RealtimeRelease(request_id="r1", session_id="sess-a"),
                                     timeout_s=30)
        assert released.existed is True
        with pytest.raises(NotFound):
            await client.call(_chunk("sess-a", 3), timeout_s=30)
    finally:
        await client.close()
    assert server.proc.poll() is None


async def test_concurrent_sessions_with_the_same_seed_match(realtime_server):
    _, socket_path = realtime_server
    clients = [await _client(socket_path), await _client(socket_path)]

    async def session(client: StageClient, sid: str) -> list[bytes]:
        frames = []
        await _open(client, sid, seed=11)
        for k in range(3):
            reply = await client.call(_chunk(sid, k), timeout_s=60)
            frames.append(reply.frames)
        await client.call(RealtimeRelease(request_id=f"rel-{sid}", session_id=sid), timeout_s=30)
        return frames

    try:
        a, b = await asyncio.gather(session(clients[0], "sess-x"), session(clients[1], "sess-y"))
        alone = await session(clients[0], "sess-z")
    finally:
        for client in clients:
            await client.close()
    assert a == b == alone
