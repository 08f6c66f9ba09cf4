"""The realtime connection in-process: the app around an InProcessStageClient of the fake
realtime engine (no sockets, no stage process)."""

from __future__ import annotations

import asyncio

import msgpack
import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from worldserve.api.app import create_app
from worldserve.api.realtime.connection import _TRANSITIONS, RealtimeConnectionState
from worldserve.api.runtime import ServerRuntime
from worldserve.config import ServerConfig
from worldserve.engines.realtime.fake import FakeRealtimeEngine
from worldserve.errors import InternalError
from worldserve.ipc.messages import ErrorReply
from worldserve.runtime.inprocess import InProcessStageClient


@pytest.fixture
def clients():
    """Stage clients made by a test; closed after it."""
    made: list[InProcessStageClient] = []
    yield made
    for client in made:
        asyncio.run(client.close())


def app_with(overrides: dict, clients):
    config = ServerConfig.model_validate({"stages": {"realtime": {
        "enabled": True, "backend": "fake", "server_args_overrides": overrides}}})
    engine = FakeRealtimeEngine(config.stages.realtime, config)
    client = InProcessStageClient("realtime", engine)
    clients.append(client)
    return create_app(ServerRuntime(config=config, clients={"realtime": client}))


def test_unsupported_pipeline_errors_then_closes_1008(clients):
    app = app_with({"fake_realtime_supported": False}, clients)
    with TestClient(app) as http:
        with http.websocket_connect("/v1/realtime_video/generate") as ws:
            error = msgpack.unpackb(ws.receive_bytes())
            with pytest.raises(WebSocketDisconnect) as closed:
                ws.receive_bytes()
    assert error == {"type": "error", "code": "unsupported_pipeline",
                     "content": "realtime video is not supported for pipeline FakeRealtimePipeline"}
    assert closed.value.code == 1008


def test_route_absent_when_stage_disabled():
    app = create_app(ServerRuntime(config=ServerConfig(), clients={}))
    with TestClient(app) as http:
        with pytest.raises(WebSocketDisconnect):  # no such route: the upgrade is refused
            with http.websocket_connect("/v1/realtime_video/generate") as ws:
                ws.receive_bytes()


def test_every_state_can_reach_closed():
    for state in RealtimeConnectionState:
        seen, frontier = {state}, [state]
        while frontier:
            for nxt in _TRANSITIONS[frontier.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        assert RealtimeConnectionState.CLOSED in seen


def test_a_session_streams_chunks_from_the_engine_then_closes_1000(clients):
    app = app_with({"frames_per_chunk": 4}, clients)
    with TestClient(app) as http:
        with http.websocket_connect("/v1/realtime_video/generate") as ws:
            ws.send_bytes(msgpack.packb({"type": "init", "prompt": "p", "size": "32x16",
                                         "max_chunks": 2}))
            sizes = []
            for _ in range(2):
                header = msgpack.unpackb(ws.receive_bytes())
                assert header["type"] in ("frame_batch", "frame_batch_header")  # inline if small
                assert (header["width"], header["height"]) == (32, 16)
                sizes.append(header["num_frames"])
                payload = header.get("payload") or ws.receive_bytes()
                assert len(payload) == header["num_frames"] * 32 * 16 * 3
                assert msgpack.unpackb(ws.receive_bytes())["type"] == "chunk_stats"
            with pytest.raises(WebSocketDisconnect) as closed:
                ws.receive_bytes()
    assert sizes == [4, 4] and closed.value.code == 1000
    assert clients[0].engine.stats()["sessions"] == 0  # released on the way out


SERVER_PATH = "/srv/private/worldserve-outputs/rt/latents.bin"


def fail_chunks_quoting_a_server_path(engine: FakeRealtimeEngine) -> None:
    """The engine answers each chunk with an OS error naming a server file, as a full disk would."""
    def failing_step() -> None:
        request, reply, _ = engine._queue.popleft()
        reply(ErrorReply(request_id=request.request_id, code=InternalError.code,
                         message=f"decode failed: [Errno 28] No space left on device: "
                                 f"'{SERVER_PATH}'"))

    engine.step = failing_step


def test_an_engine_error_reaches_the_client_without_server_paths(clients):
    """A chunk that fails on the server's side (here an OS error quoting the output folder)
    is reported as `generation_error` with the path cut to its last part, as HTTP errors are;
    the client never learns the server's layout."""
    app = app_with({}, clients)
    fail_chunks_quoting_a_server_path(clients[0].engine)
    with TestClient(app) as http:
        with http.websocket_connect("/v1/realtime_video/generate") as ws:
            ws.send_bytes(msgpack.packb({"type": "init", "prompt": "p", "size": "32x16"}))
            error = msgpack.unpackb(ws.receive_bytes())
            with pytest.raises(WebSocketDisconnect) as closed:
                ws.receive_bytes()
    assert error["type"] == "error" and error["code"] == "generation_error"
    assert "/srv/private" not in repr(error) and "worldserve-outputs" not in repr(error)
    assert ".../latents.bin" in error["detail"] and "No space left" in error["content"]
    assert closed.value.code == 1011


def test_the_vllm_omni_socket_redacts_engine_errors_too(clients):
    """The same failing chunk on vLLM-Omni's `/v1/realtime/video`: its `error` message carries
    the redacted text, never the server's folder."""
    app = app_with({}, clients)
    fail_chunks_quoting_a_server_path(clients[0].engine)
    with TestClient(app) as http:
        with http.websocket_connect("/v1/realtime/video") as ws:
            ws.send_json({"type": "session.start", "prompt": "p", "size": "32x16"})
            messages = [ws.receive_json()]
            while messages[-1]["type"] != "error":
                messages.append(ws.receive_json())
    error = messages[-1]
    assert [m["type"] for m in messages] == ["video.start", "error"]
    assert error["code"] == "generation_error" and "No space left" in error["message"]
    assert "/srv/private" not in repr(error) and ".../latents.bin" in error["message"]
