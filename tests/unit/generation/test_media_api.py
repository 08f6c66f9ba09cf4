"""The native media api against the tiny Wan engine through the in-process stage client: absolute
`url`s (request host, trusted forwarded headers, --public-url) that GET the file, and the
`GET /v1/videos` parameter rules. No sockets, no stage process."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, AsyncIterator

import httpx
import openai
import pytest

from worldserve.api.app import create_app
from worldserve.api.runtime import ServerRuntime
from worldserve.config import GenerationStageConfig, ServerConfig
from worldserve.engines.generation.engine import GenerationEngine
from worldserve.runtime.inprocess import InProcessStageClient

VIDEO = {"prompt": "a cube", "size": "64x64", "num_frames": 5, "num_inference_steps": 2}


@pytest.fixture(scope="module")
def engine(tiny_wan_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> GenerationEngine:
    cfg = GenerationStageConfig(model_path=tiny_wan_dir, batch_wait_ms=0,
                                output_dir=tmp_path_factory.mktemp("out"))
    return GenerationEngine(cfg, ServerConfig())


async def serve(engine: GenerationEngine, base_url: str = "http://testserver",
                **server: Any) -> AsyncIterator[httpx.AsyncClient]:
    config = ServerConfig.model_validate({**server, "stages": {
        "generation": {"model_path": engine.model_path, "output_dir": str(engine.output_dir)},
        "reasoner": {"enabled": False}}})
    client = InProcessStageClient("generation", engine)
    app = create_app(ServerRuntime(config=config, clients={"generation": client}))
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5000))
    async with httpx.AsyncClient(transport=transport, base_url=base_url) as http:
        yield http
    await client.close()


async def finished(http: httpx.AsyncClient, job: dict[str, Any], **headers: str) -> dict:
    for _ in range(600):
        job = (await http.get(f"/v1/videos/{job['id']}", headers=headers)).json()
        if job["status"] not in ("queued", "in_progress"):
            return job
        await asyncio.sleep(0.01)
    raise AssertionError(f"job {job['id']} did not finish")


async def test_video_url_is_absolute_and_gets_the_file(engine) -> None:
    async for http in serve(engine, show_server_paths=True):
        job = (await http.post("/v1/videos", json=VIDEO)).json()
        assert job["url"] is None  # not finished yet
        job = await finished(http, job)
        assert job["status"] == "completed"
        assert job["url"] == f"http://testserver/v1/videos/{job['id']}/content"
        content = await http.get(job["url"])
        assert content.status_code == 200 and content.headers["content-type"] == "video/mp4"
        assert content.content == Path(job["file_path"]).read_bytes()


async def test_server_paths_are_hidden_by_default(engine) -> None:
    async for http in serve(engine):
        job = await finished(http, (await http.post("/v1/videos", json=VIDEO)).json())
        assert job["status"] == "completed"
        assert job["file_path"] is None and job["file_paths"] is None
        image = await http.post("/v1/images/generations", json={
            "prompt": "a cube", "size": "64x64", "num_inference_steps": 2})
        assert image.status_code == 200 and image.json()["data"][0]["file_path"] is None
        (model,) = (await http.get("/v1/models")).json()["data"]
        assert model["root"] == model["id"]
        text = image.text + str(job) + str(model)
        assert str(engine.output_dir) not in text and str(engine.model_path) not in text


async def test_image_url_through_the_openai_sdk(engine) -> None:
    async for http in serve(engine, base_url="http://media.test:8000"):
        sdk = openai.AsyncOpenAI(base_url="http://media.test:8000/v1", api_key="-",
                                 http_client=http)
        image = (await sdk.images.generate(model="tiny-wan-test", prompt="a cube", size="64x64",  # type: ignore[arg-type]
                                           response_format="url",
                                           extra_body={"num_inference_steps": 2})).data[0]
        assert image.url and image.url.startswith("http://media.test:8000/v1/images/")
        content = await http.get(image.url)
        assert content.status_code == 200 and content.content[:4] == b"\x89PNG"


async def test_forwarded_headers_count_only_from_trusted_proxies(engine) -> None:
    proxy = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "media.example.com"}
    async for http in serve(engine):
        job = await finished(http, (await http.post("/v1/videos", json=VIDEO)).json())
        trusted = (await http.get(f"/v1/videos/{job['id']}", headers=proxy)).json()
        assert trusted["url"] == f"https://media.example.com/v1/videos/{job['id']}/content"
    async for http in serve(engine, forwarded_allow_ips="10.0.0.1"):
        job = await finished(http, (await http.post("/v1/videos", json=VIDEO)).json())
        untrusted = (await http.get(f"/v1/videos/{job['id']}", headers=proxy)).json()
        assert untrusted["url"] == f"http://testserver/v1/videos/{job['id']}/content"


async def test_public_url_wins(engine) -> None:
    async for http in serve(engine, public_url="https://cdn.example.com/ws/"):
        job = await finished(http, (await http.post("/v1/videos", json=VIDEO)).json())
        assert job["url"] == f"https://cdn.example.com/ws/v1/videos/{job['id']}/content"
        listed = (await http.get("/v1/videos", params={"limit": 1})).json()
        assert listed["data"][0]["url"] == job["url"]


@pytest.mark.parametrize("params, message", [
    ({"order": "newest"}, "order must be one of asc, desc (got 'newest')"),
    ({"limit": "0"}, "limit must be an integer from 1 to 100 (got '0')"),
    ({"limit": "101"}, "limit must be an integer from 1 to 100 (got '101')"),
    ({"limit": "ten"}, "limit must be an integer from 1 to 100 (got 'ten')"),
])
async def test_list_refuses_unknown_order_and_out_of_range_limit(engine, params, message) -> None:
    async for http in serve(engine):
        response = await http.get("/v1/videos", params=params)
        assert response.status_code == 400
        assert response.json()["error"]["message"] == message
        assert response.json()["error"]["param"] == next(iter(params))


async def test_list_orders_and_pages(engine) -> None:
    async for http in serve(engine):
        ids = [(await http.post("/v1/videos", json=VIDEO)).json()["id"] for _ in range(2)]
        for job_id in ids:
            await finished(http, {"id": job_id})
        newest = (await http.get("/v1/videos", params={"limit": 1})).json()
        oldest = (await http.get("/v1/videos", params={"limit": "1", "order": "asc"})).json()
        assert newest["data"][0]["id"] == ids[-1] and newest["has_more"] is True
        assert oldest["data"][0]["id"] != ids[-1]
