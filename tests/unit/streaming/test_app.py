"""Route availability without stage processes: the app built around stage clients whose
handshake state is set by the test (the boundary these tests are not about)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, AsyncIterator

import httpx
import pytest

from worldserve.api.app import create_app
from worldserve.api.runtime import ServerRuntime
from worldserve.config import ServerConfig
from worldserve.ipc.capabilities import ReasonerCapabilities
from worldserve.ipc.client import StageClient
from worldserve.ipc.messages import ReasonerRetention, ReasonerSampling, StageInfo

SESSION = {"system_prompt": "describe"}


def reasoner_client(tmp_path: Path, state: str = "ready", **caps: Any) -> StageClient:
    client = StageClient("reasoner", f"ipc://{tmp_path}/reasoner.sock")
    client.state = state  # type: ignore[assignment]
    client.info = StageInfo(
        request_id="hello", stage="reasoner", pid=1, state="ready", model="tiny-vl",
        model_path="/models/tiny-vl", num_params=1,
        capabilities=ReasonerCapabilities(**{
            "backend": "hf", "dtype": "bfloat16", "streaming": True, "chat": True,
            "max_model_len": 4096, "retention": ReasonerRetention(max_video_segments=8),
            "sampling": ReasonerSampling(), **caps}))
    return client


async def serve(config: ServerConfig, clients: dict[str, StageClient]) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(ServerRuntime(config=config, clients=clients))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        yield c
    for client in clients.values():
        await client.close()


@pytest.fixture
def config() -> ServerConfig:
    return ServerConfig.model_validate({"stages": {"generation": {"enabled": False}}})


async def test_backend_without_streaming_is_501(tmp_path: Path, config: ServerConfig) -> None:
    async for http in serve(config, {"reasoner": reasoner_client(tmp_path, streaming=False)}):
        for response in (await http.get("/v1/streaming/config"),
                         await http.post("/v1/streaming/sessions", json=SESSION),
                         await http.delete("/v1/streaming/sessions/sess-x")):
            assert response.status_code == 501
            assert response.json() == {"error": {
                "message": "streaming is unavailable: the 'hf' reasoner backend does not support "
                           "it", "code": 501}}
        models = (await http.get("/v1/models")).json()["data"]
        assert models[0]["capabilities"] == ["chat_completions"]


@pytest.mark.parametrize("state", ["loading", "warming", "starting"])
async def test_stage_not_ready_is_503(tmp_path: Path, config: ServerConfig, state: str) -> None:
    async for http in serve(config, {"reasoner": reasoner_client(tmp_path, state=state)}):
        response = await http.post("/v1/streaming/sessions", json=SESSION)
        assert response.status_code == 503
        assert f"state '{state}'" in response.json()["error"]["message"]
        chat = await http.post("/v1/chat/completions", json={
            "model": "tiny-vl", "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 503 and chat.json()["error"]["type"] == "service_unavailable"


async def test_stage_down_is_503(tmp_path: Path, config: ServerConfig) -> None:
    client = reasoner_client(tmp_path)
    client.mark_down("exited with status 1")
    async for http in serve(config, {"reasoner": client}):
        response = await http.get("/v1/streaming/config")
        assert response.status_code == 503
        assert "exited with status 1" in response.json()["error"]["message"]


async def test_metadata_profile_of_the_reasoner(tmp_path: Path, config: ServerConfig) -> None:
    async for http in serve(config, {"reasoner": reasoner_client(tmp_path)}):
        meta = (await http.get("/v1/metadata")).json()
        assert meta["selectedModelProfileId"] == "worldserve:tiny-vl:hf:bfloat16"
        assert meta["modelInfo"] == [{"shortName": "tiny-vl", "modelUrl": "/models/tiny-vl"}]


async def test_without_a_reasoner_stage(tmp_path: Path) -> None:
    config = ServerConfig.model_validate({"stages": {"generation": {"enabled": False},
                                                     "reasoner": {"enabled": False}}})
    async for http in serve(config, {}):
        meta = (await http.get("/v1/metadata")).json()
        assert meta["model_type"] == "generator" and meta["inference_endpoint"] is None
        assert meta["selectedModelProfileId"]
        assert (await http.get("/v1/streaming/config")).status_code == 404
        assert (await http.post("/v1/chat/completions", json={})).status_code == 404


async def test_remote_image_urls_need_allowed_media_domains(tmp_path: Path,
                                                           config: ServerConfig) -> None:
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}}
    body = {"model": "tiny-vl", "messages": [{"role": "user", "content": [image]}]}
    async for http in serve(config, {"reasoner": reasoner_client(tmp_path)}):
        response = await http.post("/v1/chat/completions", json=body)
        assert response.status_code == 400
        assert "remote image URLs are not supported" in response.json()["error"]["message"]
