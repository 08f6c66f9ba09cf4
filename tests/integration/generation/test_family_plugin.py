"""The family checklist is true (issue 21): a generation family defined only in a test module
(`toy_family.py`) is registered the documented way, as a plugin (an installed distribution
whose entry point in `worldserve.model_families` names its `ModelFamily`), and a real
`worldserve serve` serves images and a video job from it over HTTP. Nothing in worldserve
names it: the api and the engine read its declaration (defaults, size rule, family name)."""

from __future__ import annotations

import base64
import io
import time
from pathlib import Path
from typing import Iterator

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.integration.generation import toy_family as toy
from tests.support.server import REPO_ROOT, ServerProcess
from worldserve.media.video import decode_frames
from worldserve.models.registry import PLUGIN_GROUP


def install_plugin(site: Path) -> None:
    """What `pip install` of a plugin package leaves on the path: its metadata and entry point."""
    dist = site / "worldserve_toy_family-0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: worldserve-toy-family\n"
                                   "Version: 0.0\n")
    (dist / "entry_points.txt").write_text(f"[{PLUGIN_GROUP}]\ntoy = {toy.__name__}:FAMILY\n")


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    work = tmp_path_factory.mktemp("toy")
    model = work / "toy-model"
    model.mkdir()
    (model / "model_index.json").write_text(f'{{"_class_name": "{toy.PIPELINE}"}}')
    install_plugin(work / "site")
    config = {"stages": {"reasoner": {"enabled": False},
                         "generation": {"model_path": str(model), "batch_wait_ms": 0}}}
    server = ServerProcess(work, config, env={"PYTHONPATH": f"{REPO_ROOT}:{work / 'site'}"})
    try:
        server.wait_healthy()
        with httpx.Client(base_url=server.base_url, timeout=60) as client:
            yield client
    finally:
        server.stop()


def test_images_use_the_declared_defaults(http: httpx.Client) -> None:
    resp = http.post("/v1/images/generations", json={"prompt": "a toy", "n": 2, "seed": 11})
    assert resp.status_code == 200, resp.text
    images = [Image.open(io.BytesIO(base64.b64decode(item["b64_json"])))  # declared b64_json
              for item in resp.json()["data"]]
    steps = toy.DEFAULTS.num_inference_steps
    for seed, image in zip((11, 12), images):  # n=2: seed, seed + 1
        assert image.size == (toy.DEFAULTS.image_width, toy.DEFAULTS.image_height)
        assert set(image.convert("RGB").getdata()) == {toy.pixel(seed, steps)}


def test_a_video_job_runs_the_requested_steps(http: httpx.Client) -> None:
    resp = http.post("/v1/videos", json={"prompt": "a toy", "seed": 5, "num_frames": 5,
                                         "num_inference_steps": 2})
    assert resp.status_code == 200, resp.text
    job = wait_job(http, resp.json()["id"])
    assert job["status"] == "completed", job
    frames = decode_frames(http.get(f"/v1/videos/{job['id']}/content").content)
    assert len(frames) == 5  # the declared size:
    assert frames[0].shape == (toy.DEFAULTS.height, toy.DEFAULTS.width, 3)
    drift = np.abs(np.stack(frames).astype(int) - np.array(toy.pixel(5, 2))).max()
    assert drift <= 8  # H.264 (yuv420) of one flat colour


def test_the_family_rules_and_name_come_from_the_declaration(http: httpx.Client) -> None:
    resp = http.post("/v1/images/generations", json={"prompt": "a toy", "size": "44x24"})
    assert resp.status_code == 400 and "multiple of 8" in resp.json()["error"]["message"]
    info = http.get("/admin/model_info").json()
    generation = info["stages"]["generation"]
    assert generation["family"] == "toy" and generation["pipeline"] == "ToyPipeline"


def wait_job(http: httpx.Client, job_id: str, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = http.get(f"/v1/videos/{job_id}").json()
        if job["status"] in ("completed", "failed", "cancelled"):
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not finish")
