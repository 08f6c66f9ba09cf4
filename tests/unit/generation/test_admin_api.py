"""The operator routes (/admin/model_info, lora, weights, memory, generation pause) through the
app and the in-process stage client on the tiny Wan engine: admin key rules, each route, bad
input, per-request `lora` on images/videos/actions, 503 while the weights are released."""

from __future__ import annotations

import asyncio
import base64
import io
from typing import Any, AsyncIterator

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.support.machine import require_module
from tests.unit.generation import admin_fixtures as fx
from worldserve.api.app import create_app
from worldserve.api.runtime import ServerRuntime
from worldserve.config import GenerationStageConfig, ServerConfig
from worldserve.engines.generation.engine import GenerationEngine
from worldserve.runtime.inprocess import InProcessStageClient

require_module("peft")

ROUTES = [("GET", "/admin/model_info", None), ("GET", "/admin/lora", None),
          ("POST", "/admin/lora/load", {"name": "a", "path": "/x"}),
          ("POST", "/admin/lora/unload", {"name": "a"}),
          ("POST", "/admin/weights/update", {"path": "/x"}),
          ("POST", "/admin/memory/release", None), ("POST", "/admin/memory/resume", None),
          ("POST", "/admin/generation/pause", None),
          ("POST", "/admin/generation/continue", None)]
IMAGE = {"prompt": fx.PROMPT, "size": f"{fx.SIZE}x{fx.SIZE}", "num_inference_steps": fx.STEPS,
         "guidance_scale": 1.0, "max_sequence_length": 32, "seed": 7,
         "response_format": "b64_json"}


@pytest.fixture
def engine(tiny_wan_dir, tmp_path) -> GenerationEngine:
    cfg = GenerationStageConfig(model_path=tiny_wan_dir, batch_wait_ms=0,
                                output_dir=tmp_path / "out")
    return GenerationEngine(cfg, ServerConfig())


async def serve(engine: GenerationEngine, *, admin_key: str | None = None,
                host: str = "127.0.0.1") -> AsyncIterator[httpx.AsyncClient]:
    config = ServerConfig.model_validate({"stages": {
        "generation": {"model_path": engine.model_path, "output_dir": str(engine.output_dir)},
        "reasoner": {"enabled": False}}})
    client = InProcessStageClient("generation", engine)
    app = create_app(ServerRuntime(config=config, clients={"generation": client},
                                   admin_key=admin_key))
    transport = httpx.ASGITransport(app=app, client=(host, 5000))
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver",
                                 timeout=120) as http:
        yield http
    await client.close()


def image_pixels(body: dict) -> np.ndarray:
    data = base64.b64decode(body["data"][0]["b64_json"])
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))[None]


def error(response: httpx.Response) -> str:
    body = response.json()
    return body["error"]["message"] if "error" in body else str(body)


async def call(http: httpx.AsyncClient, method: str, path: str, body: Any = None,
               **kw: Any) -> httpx.Response:
    return await http.request(method, path, json=body, **kw)


# ------------------------------------------------------------------ auth


@pytest.mark.parametrize("method, path, body", ROUTES)
async def test_admin_key_rules(engine, method, path, body) -> None:
    async for http in serve(engine, admin_key="k3y", host="10.1.2.3"):
        missing = await call(http, method, path, body)
        assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
        wrong = await call(http, method, path, body, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 403
    async for http in serve(engine, host="10.1.2.3"):  # no key: loopback only
        remote = await call(http, method, path, body)
        assert remote.status_code == 403 and "loopback" in error(remote)


async def test_the_key_opens_them_from_anywhere_and_loopback_needs_none(engine) -> None:
    async for http in serve(engine, admin_key="k3y", host="10.1.2.3"):
        ok = await http.get("/admin/lora", headers={"Authorization": "Bearer k3y"})
        assert ok.status_code == 200 and ok.json()["adapters"] == []
    async for http in serve(engine):
        assert (await http.get("/admin/model_info")).status_code == 200


async def test_routes_are_in_the_openapi_schema(engine) -> None:
    async for http in serve(engine):
        paths = (await http.get("/openapi.json")).json()["paths"]
        for method, path, _ in ROUTES:
            assert method.lower() in paths[path], path
        load = paths["/admin/lora/load"]["post"]
        assert "requestBody" in load


# ------------------------------------------------------------------ routes


async def test_model_info(engine) -> None:
    async for http in serve(engine):
        info = (await http.get("/admin/model_info")).json()["stages"]["generation"]
        assert info["state"] == "ready" and info["family"] == "wan"
        assert info["path"] == engine.model_path and info["num_params"] == engine.num_params
        assert info["tasks"] == ["images", "videos", "actions"] and info["sound"] is False
        assert info["lora"] == {"supported": True, "adapters": []}


async def test_lora_routes_and_per_request_lora(engine, tiny_wan_dir, admin_assets) -> None:
    path = str(admin_assets["lora_a"])
    async for http in serve(engine):
        loaded = await http.post("/admin/lora/load",
                                 json={"name": "a", "path": path, "scale": 0.8})
        assert loaded.status_code == 200, loaded.text
        assert (await http.get("/admin/lora")).json()["adapters"] == [
            {"name": "a", "path": path, "scale": 0.8}]
        with_a = await http.post("/v1/images/generations", json={**IMAGE, "lora": "a"})
        scaled = await http.post("/v1/images/generations",
                                 json={**IMAGE, "lora": [{"name": "a", "scale": 0.3}]})
        plain = await http.post("/v1/images/generations", json=IMAGE)
        for response in (with_a, scaled, plain):
            assert response.status_code == 200, response.text
        fx.assert_close_uint8(image_pixels(with_a.json()), fx.reference(
            tiny_wan_dir, 7, loras=[(admin_assets["lora_a"], "a", 0.8)]))
        fx.assert_close_uint8(image_pixels(scaled.json()), fx.reference(
            tiny_wan_dir, 7, loras=[(admin_assets["lora_a"], "a", 0.3)]))
        fx.assert_close_uint8(image_pixels(plain.json()), fx.reference(tiny_wan_dir, 7))
        await http.post("/admin/generation/pause")  # keeps the video job queued
        video = await http.post("/v1/videos", json={**IMAGE, "num_frames": 5, "lora": "a"})
        assert video.status_code == 200, video.text
        in_use = await http.post("/admin/lora/unload", json={"name": "a"})
        assert in_use.status_code == 409 and "selected by 1" in error(in_use)
        await http.post("/admin/generation/continue")
        assert (await finished(http, video.json()))["status"] == "completed"
        unloaded = await http.post("/admin/lora/unload", json={"name": "a"})
        assert unloaded.status_code == 200 and unloaded.json()["adapters"] == []


@pytest.mark.parametrize("body, status, message", [
    ({"path": "/x"}, 400, "name: Field required"),
    ({"name": "a", "path": "/x", "extra": 1}, 400, "extra: Extra inputs are not permitted"),
    ({"name": "a.b", "path": "/x"}, 400, "name: String should match pattern"),
    ({"name": "a", "path": "/nonexistent/lora"}, 400, "LoRA path '/nonexistent/lora' does not"),
    ({"name": "a", "path": "/x", "scale": 1000}, 400, "scale: Input should be less than"),
])
async def test_lora_load_bad_input(engine, body, status, message) -> None:
    async for http in serve(engine):
        response = await http.post("/admin/lora/load", json=body)
        assert response.status_code == status and message in error(response)


async def test_lora_bad_input_from_files_and_requests(engine, admin_assets) -> None:
    async for http in serve(engine):
        wrong = await http.post("/admin/lora/load", json={
            "name": "w", "path": str(admin_assets["updated"] / "transformer")})
        assert wrong.status_code == 400 and "cannot load LoRA 'w'" in error(wrong)
        unknown = await http.post("/admin/lora/unload", json={"name": "nope"})
        assert unknown.status_code == 400 and "unknown LoRA adapter 'nope'" in error(unknown)
        for lora, message in [("nope", "unknown LoRA adapter 'nope'"),
                              ({"name": "a", "path": "/etc"}, "unknown key 'path'"),
                              ([{"name": "a"}, "a"], "names an adapter twice"),
                              ({"name": "a", "scale": "big"}, "lora.scale must be a number")]:
            response = await http.post("/v1/images/generations", json={**IMAGE, "lora": lora})
            assert response.status_code == 400 and message in error(response), response.text
        video = await http.post("/v1/videos", json={**IMAGE, "lora": "nope"})
        assert video.status_code == 400 and "unknown LoRA adapter" in error(video)
        actions = await http.post("/v1/actions/generations", json={
            "input": {"task": "pick"}, "lora": {"name": "nope"}})
        assert actions.status_code == 400 and "LoRA" in error(actions), actions.text


async def test_weights_update_route(engine, tiny_wan_dir, admin_assets) -> None:
    expected = fx.first_mismatch(tiny_wan_dir, admin_assets["wrong"])
    async for http in serve(engine):
        bad = await http.post("/admin/weights/update", json={"path": str(admin_assets["wrong"])})
        assert bad.status_code == 400 and f"tensor '{expected}'" in error(bad)
        missing = await http.post("/admin/weights/update", json={"path": "/nonexistent"})
        assert missing.status_code == 400 and "not a directory" in error(missing)
        assert (await http.post("/admin/weights/update", json={})).status_code == 400
        ok = await http.post("/admin/weights/update", json={"path": str(admin_assets["updated"])})
        assert ok.status_code == 200, ok.text
        assert ok.json()["tensors"]["transformer"] > 0
        image = await http.post("/v1/images/generations", json=IMAGE)
        fx.assert_close_uint8(image_pixels(image.json()), fx.reference(
            tiny_wan_dir, 7, transformer_dir=admin_assets["updated"] / "transformer"))


async def test_memory_release_and_resume_routes(engine, tiny_wan_dir) -> None:
    async for http in serve(engine):
        released = await http.post("/admin/memory/release")
        assert released.status_code == 200 and released.json()["memory"] == "released"
        refused = await http.post("/v1/images/generations", json=IMAGE)
        assert refused.status_code == 503 and "model weights released" in refused.text
        video = await http.post("/v1/videos", json={**IMAGE, "num_frames": 5})
        assert video.status_code == 503 and "model weights released" in video.text
        for _ in range(100):  # the stage's state change reaches the api after the reply
            health = await http.get("/health")
            if health.json()["stages"]["generation"] == "released":
                break
            await asyncio.sleep(0.01)
        assert health.status_code == 503 and health.json()["status"] == "released"
        assert health.json()["running"] is True
        metrics = (await http.get("/metrics")).text
        assert 'worldserve_stage_up{stage="generation"} 1.0' in metrics
        assert 'worldserve_stage_weights_released{stage="generation"} 1.0' in metrics
        bad_stage = await http.post("/admin/memory/release", json={"stage": "realtime"})
        assert bad_stage.status_code == 400 and "not enabled" in error(bad_stage)
        resumed = await http.post("/admin/memory/resume")
        assert resumed.status_code == 200 and resumed.json()["memory"] == "resident"
        image = await http.post("/v1/images/generations", json=IMAGE)
        assert image.status_code == 200
        fx.assert_close_uint8(image_pixels(image.json()), fx.reference(tiny_wan_dir, 7))
        for _ in range(100):
            if (await http.get("/health")).status_code == 200:
                break
            await asyncio.sleep(0.01)
        assert (await http.get("/health")).json()["status"] == "ok"


async def test_pause_holds_a_video_job_and_continue_finishes_it(engine) -> None:
    async for http in serve(engine):
        paused = await http.post("/admin/generation/pause")
        assert paused.status_code == 200 and paused.json()["paused"] is True
        job = (await http.post("/v1/videos", json={**IMAGE, "num_frames": 5})).json()
        await asyncio.sleep(0.3)
        held = (await http.get(f"/v1/videos/{job['id']}")).json()
        assert held["status"] == "queued" and held["progress"] == 0
        assert (await http.get("/admin/model_info")).json()["stages"]["generation"]["paused"]
        resumed = await http.post("/admin/generation/continue")
        assert resumed.status_code == 200 and resumed.json()["paused"] is False
        assert (await finished(http, job))["status"] == "completed"


async def finished(http: httpx.AsyncClient, job: dict) -> dict:
    for _ in range(1000):
        job = (await http.get(f"/v1/videos/{job['id']}")).json()
        if job["status"] not in ("queued", "in_progress"):
            return job
        await asyncio.sleep(0.02)
    raise AssertionError(f"job {job['id']} did not finish")


class BareEngine:
    """A stage engine without admin operations (as the reasoner and realtime engines are)."""

    model_name, model_path, num_params = "bare", "/models/bare", 3

    def capabilities(self) -> None:
        return None

    def state(self) -> str:
        return "ready"

    def submit(self, request, reply) -> None:
        from worldserve.errors import InvalidRequest

        raise InvalidRequest(f"the bare stage does not handle {type(request).__name__}")

    def cancel(self, request_id: str) -> None:
        pass

    def has_work(self) -> bool:
        return False

    def step(self) -> None:
        pass

    def stats(self) -> dict:
        return {"queue_depth": 0, "running": 0}

    def shutdown(self) -> None:
        pass


async def test_stages_without_admin_operations(engine) -> None:
    config = ServerConfig.model_validate({"stages": {
        "generation": {"model_path": engine.model_path, "output_dir": str(engine.output_dir)},
        "reasoner": {"enabled": False}}})
    clients = {"generation": InProcessStageClient("generation", engine),
               "reasoner": InProcessStageClient("reasoner", BareEngine())}  # type: ignore[arg-type]
    app = create_app(ServerRuntime(config=config, clients=clients))
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5000))
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
        stages = (await http.get("/admin/model_info")).json()["stages"]
        assert stages["reasoner"]["model"] == "bare" and stages["reasoner"]["num_params"] == 3
        assert stages["reasoner"]["lora"] == {"supported": False, "adapters": []}
        assert stages["generation"]["family"] == "wan"
        refused = await http.post("/admin/memory/release", json={"stage": "reasoner"})
        assert refused.status_code == 400 and "does not handle MemoryRelease" in error(refused)
    for client in clients.values():
        await client.close()
