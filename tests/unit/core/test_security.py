"""Who may call (`--api-key`, api/security.py) and the one error shape of every HTTP route."""

from __future__ import annotations

from pathlib import Path
from typing import AsyncIterator

import httpx
import pytest
from starlette.testclient import TestClient, WebSocketDenialResponse

from tests.unit.streaming.test_app import reasoner_client
from worldserve.api.app import create_app
from worldserve.api.runtime import ServerRuntime
from worldserve.api.security import is_open_path, key_matches
from worldserve.config import ServerConfig

KEY = "s3cret-key"
CHAT = {"model": "tiny-vl", "messages": [{"role": "user", "content": "hi"}]}
CONFIG = ServerConfig.model_validate({"stages": {"generation": {"enabled": False}}})
OPEN = ["/health", "/v1/health/live", "/v1/health/ready", "/metrics", "/version",
        "/v1/metadata", "/nim/reasoner/v1/health/ready", "/nim/reasoner/v1/metadata",
        "/admin/server_info", "/", "/openapi.json"]
GUARDED = ["/v1/chat/completions", "/v1/models", "/v1/streaming/config", "/v1/videos",
           "/nim/reasoner/v1/chat/completions", "/v2/anything", "/healthcheck", "/metrics2",
           "/nim/reasoner", "/adminx"]


def _app(tmp_path: Path, api_key: str | None) -> object:
    runtime = ServerRuntime(config=CONFIG, clients={"reasoner": reasoner_client(tmp_path)},
                            api_key=api_key)
    return create_app(runtime)


async def _http(tmp_path: Path, api_key: str | None) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=_app(tmp_path, api_key), client=("127.0.0.1", 5000))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        yield http


@pytest.mark.parametrize("path", OPEN)
def test_open_paths(path: str) -> None:
    assert is_open_path(path)


@pytest.mark.parametrize("path", GUARDED)
def test_guarded_paths(path: str) -> None:
    assert not is_open_path(path)


def test_key_matches_only_the_key() -> None:
    assert key_matches(KEY, KEY)
    assert not key_matches(None, KEY)
    assert not key_matches(KEY[:-1], KEY) and not key_matches(KEY + "x", KEY)


async def test_api_key_guards_inference_routes(tmp_path: Path) -> None:
    async for http in _http(tmp_path, KEY):
        missing = await http.post("/v1/chat/completions", json=CHAT)
        assert missing.status_code == 401 and missing.headers["WWW-Authenticate"] == "Bearer"
        assert missing.json() == {"error": {
            "message": "this server needs an API key: send 'Authorization: Bearer <key>'",
            "type": "authentication_error", "param": None, "code": "authentication_required"}}
        wrong = await http.post("/v1/chat/completions", json=CHAT,
                                headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and KEY not in wrong.text
        assert (await http.get("/v1/models")).status_code == 401
        right = await http.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        assert right.status_code == 200
        for path in ("/health", "/v1/health/ready", "/version", "/metrics", "/v1/metadata"):
            assert (await http.get(path)).status_code == 200, path
        # /admin answers its own rule (loopback without an admin key), not the API key's
        assert (await http.get("/admin/server_info")).status_code == 200


async def test_without_api_key_inference_routes_are_open(tmp_path: Path) -> None:
    async for http in _http(tmp_path, None):
        assert (await http.get("/v1/models")).status_code == 200


def test_api_key_guards_websockets_by_header(tmp_path: Path) -> None:
    client = TestClient(_app(tmp_path, KEY))
    with pytest.raises(WebSocketDenialResponse) as refused:
        with client.websocket_connect("/v1/streaming/ws"):
            pass
    assert refused.value.status_code == 401
    with pytest.raises(WebSocketDenialResponse):  # the key in the query is not read
        with client.websocket_connect(f"/v1/streaming/ws?api_key={KEY}"):
            pass
    with client.websocket_connect("/v1/streaming/ws",
                                  headers={"Authorization": f"Bearer {KEY}"}) as ws:
        ws.close()


async def test_every_surface_answers_the_openai_error_shape(tmp_path: Path) -> None:
    async for http in _http(tmp_path, None):
        responses = [
            await http.post("/v1/chat/completions", json={"model": "tiny-vl"}),  # OpenAI
            await http.post("/v1/streaming/sessions", json={"nope": 1}),  # NIM streaming
            await http.post("/v1/infer", json={}),  # NIM infer (a runtime-aware 404 here)
            await http.get("/v1/nosuch"),  # app-wide
        ]
    for response in responses:
        assert response.status_code >= 400
        assert set(response.json()["error"]) >= {"message", "type", "param", "code"}, \
            response.text
