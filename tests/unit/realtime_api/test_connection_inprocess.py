"""The connection state machine in-process, around a stage client that is never reached
(the stage boundary is faked: capabilities only)."""

from __future__ import annotations

import asyncio

import msgpack
import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from worldserve.api.app import create_app
from worldserve.api.realtime.connection import _TRANSITIONS, ConnectionState
from worldserve.api.runtime import ServerRuntime
from worldserve.config import ServerConfig
from worldserve.ipc.capabilities import RealtimeCapabilities
from worldserve.ipc.client import StageClient
from worldserve.ipc.messages import StageInfo


@pytest.fixture
def clients():
    """Stage clients made by a test; closed after it (an open ZeroMQ socket blocks exit)."""
    made: list[StageClient] = []
    yield made
    for client in made:
        asyncio.run(client.close())


def app_with(capabilities: dict, tmp_path, clients):
    config = ServerConfig.model_validate(
        {"stages": {"realtime": {"enabled": True, "backend": "fake"}}})
    client = StageClient("realtime", f"ipc://{tmp_path}/nobody.sock")
    clients.append(client)
    client.info = StageInfo(request_id="h", stage="realtime", pid=0, state="ready",
                            model="m", model_path="", num_params=0,
                            capabilities=RealtimeCapabilities(**capabilities))
    client.state = "ready"
    return create_app(ServerRuntime(config=config, clients={"realtime": client}))


def test_unsupported_pipeline_errors_then_closes_1008(tmp_path, clients):
    app = app_with({"pipeline": "WanPipeline", "realtime_supported": False}, tmp_path, clients)
    with TestClient(app) as http:
        with http.websocket_connect("/v1/realtime_video/generate") as ws:
            error = msgpack.unpackb(ws.receive_bytes())
            with pytest.raises(WebSocketDisconnect) as closed:
                ws.receive_bytes()
    assert error == {"type": "error", "code": "unsupported_pipeline",
                     "content": "realtime video is not supported for pipeline WanPipeline"}
    assert closed.value.code == 1008


def test_route_absent_when_stage_disabled():
    app = create_app(ServerRuntime(config=ServerConfig(), clients={}))
    with TestClient(app) as http:
        with pytest.raises(WebSocketDisconnect):  # no such route: the upgrade is refused
            with http.websocket_connect("/v1/realtime_video/generate") as ws:
                ws.receive_bytes()


def test_every_state_can_reach_closed():
    for state in ConnectionState:
        seen, frontier = {state}, [state]
        while frontier:
            for nxt in _TRANSITIONS[frontier.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        assert ConnectionState.CLOSED in seen
