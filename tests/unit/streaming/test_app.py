"""Route availability without stage processes: the app built around in-process stage clients
of an engine that only declares capabilities; the stage state the supervisor would report is set
by the test (the boundary these tests are not about)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, AsyncIterator

import httpx
import pytest

from worldserve.api.app import create_app
from worldserve.api.runtime import ServerRuntime
from worldserve.config import ServerConfig
from worldserve.errors import NotSupported
from worldserve.ipc.capabilities import ReasonerCapabilities
from worldserve.ipc.client import StageClient
from worldserve.ipc.messages import ReasonerRetention, ReasonerSampling
from worldserve.runtime.inprocess import InProcessStageClient

SESSION = {"system_prompt": "describe"}


class DeclaringEngine:
    """A reasoner engine that only declares capabilities (these tests never reach a model)."""

    model_name, model_path, num_params = "tiny-vl", "/models/tiny-vl", 1

    def __init__(self, **caps: Any) -> None:
        self.caps = ReasonerCapabilities(
            **{
                "backend": "hf",
                "dtype": "bfloat16",
                "streaming": True,
                "chat": True,
                "max_model_len": 4096,
                "retention": ReasonerRetention(max_video_segments=8),
                "sampling": ReasonerSampling(),
                **caps,
            }
        )

    def capabilities(self) -> ReasonerCapabilities:
        return self.caps

    def state(self) -> str:
        return "ready"

    def submit(self, request: Any, reply: Any) -> None:
        raise NotSupported(f"{type(request).__name__} is not part of these tests")

    def cancel(self, request_id: str) -> None: ...

    def has_work(self) -> bool:
        return False

    def step(self) -> None: ...

    def stats(self) -> dict[str, Any]:
        return {"queue_depth": 0, "running": 0}

    def shutdown(self) -> None: ...


def reasoner_client(tmp_path: Path, state: str = "ready", **caps: Any) -> StageClient:
    client = InProcessStageClient("reasoner", DeclaringEngine(**caps))  # type: ignore[arg-type]
    client.state = state  # type: ignore[assignment]  # the supervisor's view of the stage
    return client


async def serve(
    config: ServerConfig, clients: dict[str, StageClient]
) -> AsyncIterator[httpx.AsyncClient]:
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
        for response in (
            await http.get("/v1/streaming/config"),
            await http.post("/v1/streaming/sessions", json=SESSION),
            await http.delete("/v1/streaming/sessions/sess-x"),
        ):
            assert response.status_code == 501
            assert response.json() == {
                "error": {
                    "message": "streaming is unavailable: the 'hf' reasoner backend does not support "  # noqa: E501
                    "it",
                    "type": "not_implemented_error",
                    "param": None,
                    "code": 501,
                }
            }
        models = (await http.get("/v1/models")).json()["data"]
        assert models[0]["capabilities"] == ["chat_completions", "responses"]


@pytest.mark.parametrize("state", ["loading", "warming", "starting"])
async def test_stage_not_ready_is_503(tmp_path: Path, config: ServerConfig, state: str) -> None:
    async for http in serve(config, {"reasoner": reasoner_client(tmp_path, state=state)}):
        response = await http.post("/v1/streaming/sessions", json=SESSION)
        assert response.status_code == 503
        assert f"state '{state}'" in response.json()["error"]["message"]
        chat = await http.post(
            "/v1/chat/completions",
            json={"model": "tiny-vl", "messages": [{"role": "user", "content": "hi"}]},
        )
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
        # the model's directory only with --show-server-paths (docs/security.md)
        assert meta["modelInfo"] == [{"shortName": "tiny-vl", "modelUrl": "tiny-vl"}]
    shown = config.model_copy(update={"show_server_paths": True})
    async for http in serve(shown, {"reasoner": reasoner_client(tmp_path)}):
        meta = (await http.get("/v1/metadata")).json()
        assert meta["modelInfo"] == [{"shortName": "tiny-vl", "modelUrl": "/models/tiny-vl"}]


async def test_without_a_reasoner_stage(tmp_path: Path) -> None:
    config = ServerConfig.model_validate(
        {"stages": {"generation": {"enabled": False}, "reasoner": {"enabled": False}}}
    )
    async for http in serve(config, {}):
        meta = (await http.get("/v1/metadata")).json()
        assert meta["model_type"] == "generator" and meta["inference_endpoint"] is None
        assert meta["selectedModelProfileId"]
        assert (await http.get("/v1/streaming/config")).status_code == 404
        assert (await http.post("/v1/chat/completions", json={})).status_code == 404


async def test_remote_image_urls_need_allowed_media_domains(
    tmp_path: Path, config: ServerConfig
) -> None:
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}}
    body = {"model": "tiny-vl", "messages": [{"role": "user", "content": [image]}]}
    async for http in serve(config, {"reasoner": reasoner_client(tmp_path)}):
        response = await http.post("/v1/chat/completions", json=body)
        assert response.status_code == 400
        assert "remote image URLs are not supported" in response.json()["error"]["message"]
