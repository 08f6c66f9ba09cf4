"""`Idempotency-Key` on `POST /v1/videos` and the image routes through real servers sharing one
output directory: 50 concurrent submissions under one key make one job, the mapping survives a
restart, another body under the key is a 409 naming it, and the key goes with its job."""

from __future__ import annotations

import asyncio
import io

import httpx
from PIL import Image

from tests.integration.generation.conftest import start_server
from tests.integration.generation.test_lifecycle import wait_status

VIDEO = {"prompt": "same", "size": "64x64", "num_frames": 5, "num_inference_steps": 2, "seed": 1}
KEY = {"Idempotency-Key": "order-42"}


async def _submit_concurrently(base_url: str, count: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        return await asyncio.gather(*(client.post("/v1/videos", json=VIDEO, headers=KEY)
                                      for _ in range(count)))


def _video_ids(base_url: str) -> list[str]:
    return [job["id"] for job in httpx.get(f"{base_url}/v1/videos", timeout=10).json()["data"]]


def _refused_with_409(base_url: str, body: dict) -> None:
    refused = httpx.post(f"{base_url}/v1/videos", json=body, headers=KEY, timeout=30)
    assert refused.status_code == 409, refused.text
    assert "'order-42'" in refused.json()["error"]["message"]


def test_one_job_per_key_across_concurrency_restart_and_deletion(tmp_path, gen_model_dir):
    server = start_server(tmp_path, gen_model_dir)
    try:
        replies = asyncio.run(_submit_concurrently(server.base_url, 50))
        assert {r.status_code for r in replies} == {200}, [r.text for r in replies][:3]
        ids = {r.json()["id"] for r in replies}
        assert len(ids) == 1 and _video_ids(server.base_url) == list(ids)
        job_id = ids.pop()
        # the same body with its keys in another order is the same request
        same = httpx.post(f"{server.base_url}/v1/videos", headers=KEY, timeout=30,
                          json=dict(reversed(list(VIDEO.items()))))
        assert same.json()["id"] == job_id
        _refused_with_409(server.base_url, {**VIDEO, "seed": 2})
        too_long = httpx.post(f"{server.base_url}/v1/videos", json=VIDEO, timeout=30,
                              headers={"Idempotency-Key": "k" * 256})
        assert too_long.status_code == 400 and "Idempotency-Key" in too_long.text
        wait_status(server.base_url, job_id, {"completed"}, timeout_s=120)
    finally:
        server.stop()

    restarted = start_server(tmp_path, gen_model_dir)
    try:
        base = restarted.base_url
        again = httpx.post(f"{base}/v1/videos", json=VIDEO, headers=KEY, timeout=30)
        assert again.status_code == 200 and again.json()["id"] == job_id
        assert again.json()["status"] == "completed"
        _refused_with_409(base, {**VIDEO, "prompt": "another"})
        # the key expires with its job: deleted, the key names a new request's job
        assert httpx.delete(f"{base}/v1/videos/{job_id}", timeout=30).status_code == 200
        fresh = httpx.post(f"{base}/v1/videos", json={**VIDEO, "seed": 2}, headers=KEY,
                           timeout=30)
        assert fresh.status_code == 200 and fresh.json()["id"] != job_id
    finally:
        restarted.stop()


def test_image_key_returns_the_same_images(gen_server):
    base = gen_server.base_url
    headers = {"Idempotency-Key": "image-7"}
    body = {"prompt": "x", "size": "64x64", "num_inference_steps": 2, "seed": 3,
            "response_format": "b64_json"}
    first, again = (httpx.post(f"{base}/v1/images/generations", json=body, headers=headers,
                               timeout=60) for _ in range(2))
    assert first.status_code == again.status_code == 200, first.text
    assert first.json()["id"] == again.json()["id"]
    assert first.json()["data"] == again.json()["data"]
    edit = httpx.post(f"{base}/v1/images/edits", headers=headers, timeout=60,
                      data={"prompt": "x", "size": "64x64"},
                      files={"image": ("a.png", _png(), "image/png")})
    assert edit.status_code == 409 and "'image-7'" in edit.text, edit.text


def _png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 64), "red").save(out, format="PNG")
    return out.getvalue()
