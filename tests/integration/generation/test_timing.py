"""Timing a client can read, through a real server (tiny Wan): `Server-Timing` (the wait for
admission, `queue`, the phases the engine reported, in milliseconds, and `total`) on the
synchronous image and video answers and on `/content`; `X-Inference-Time-S` and
`X-Peak-Memory-MB` on the synchronous answers."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.generation.test_lifecycle import wait_status

PHASES = {"queue", "encode", "denoise", "decode", "mux", "total"}
IMAGE = {"prompt": "x", "size": "64x64", "num_inference_steps": 2}
VIDEO = {"prompt": "x", "size": "64x64", "num_frames": 5, "num_inference_steps": 2}


@pytest.fixture(scope="module")
def http(gen_server):
    with httpx.Client(base_url=gen_server.base_url, timeout=120) as client:
        yield client


def server_timing(response: httpx.Response) -> dict[str, float]:
    """`name;dur=ms, ...` as a mapping; every name one the job records know."""
    out = {}
    for entry in response.headers["server-timing"].split(","):
        name, duration = entry.strip().split(";dur=")
        out[name] = float(duration)
    assert set(out) <= PHASES and {"queue", "denoise", "total"} <= set(out), out
    assert list(out)[0] == "queue"  # acceptance to admission comes first
    assert all(ms >= 0 for ms in out.values()) and out["total"] > 0
    return out


def assert_sync_figures(response: httpx.Response) -> None:
    assert float(response.headers["x-inference-time-s"]) > 0
    assert float(response.headers["x-peak-memory-mb"]) >= 0
    timing = server_timing(response)
    assert timing["total"] == pytest.approx(
        float(response.headers["x-inference-time-s"]) * 1000, abs=1)


def test_a_synchronous_image_and_its_content(http):
    image = http.post("/v1/images/generations", json=IMAGE)
    assert image.status_code == 200, image.text
    assert_sync_figures(image)
    content = http.get(f"/v1/images/{image.json()['id']}/content")
    assert content.status_code == 200
    assert server_timing(content) == server_timing(image)


def test_a_synchronous_video_and_a_video_job_content(http):
    video = http.post("/v1/videos/sync", json=VIDEO)
    assert video.status_code == 200, video.text
    assert_sync_figures(video)
    job = http.post("/v1/videos", json=VIDEO).json()
    wait_status(str(http.base_url).rstrip("/"), job["id"], {"completed"}, timeout_s=120)
    content = http.get(f"/v1/videos/{job['id']}/content")
    assert content.status_code == 200
    assert "denoise" in server_timing(content)
