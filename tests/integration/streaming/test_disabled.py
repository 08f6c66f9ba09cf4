"""Streaming switched off by the NIM variable (NIM_ENABLE_STREAMING=false): routes absent, chat
still served. (WORLDSERVE_ENABLE_STREAMING is the same key: tests/unit/core/test_config.py.)"""

from __future__ import annotations

from typing import Iterator

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.integration.streaming.support import SESSION_BODY, fake_config, start_server
from tests.support.server import ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("disabled")
    server = start_server(workdir, fake_config(workdir), env={"NIM_ENABLE_STREAMING": "false"})
    yield server
    server.stop()


def test_streaming_routes_are_not_registered(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.base_url, timeout=10) as http:
        assert http.get("/v1/streaming/config").status_code == 404
        assert http.post("/v1/streaming/sessions", json=SESSION_BODY).status_code == 404
        assert http.post("/v1/streaming/sessions/sess-x/frame").status_code == 404
        assert http.delete("/v1/streaming/sessions/sess-x").status_code == 404
    with pytest.raises(InvalidStatus):
        connect(f"{server.ws_url}/v1/streaming/ws", open_timeout=10)


def test_chat_and_metadata_still_work(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.base_url, timeout=10) as http:
        body = {"model": "fake-reasoner", "messages": [{"role": "user", "content": "hi"}]}
        done = http.post("/v1/chat/completions", json=body)
        assert done.status_code == 200 and done.json()["choices"][0]["message"]["content"]
        meta = http.get("/v1/metadata").json()
        assert meta["model_type"] == "reasoner"
        assert meta["streaming"] == {"enabled": False, "websocket": False, "rest": False}
        models = http.get("/v1/models").json()["data"]
        assert models[0]["capabilities"] == ["chat_completions", "responses"]
