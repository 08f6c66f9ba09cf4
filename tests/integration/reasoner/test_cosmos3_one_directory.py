"""`worldserve serve --model-path DIR` with a generator (`model_index.json`) and a Cosmos3
reasoner (`config.json`, model_type cosmos3_omni) in one directory starts both stages with no
further flags, and every model listing names the directory's model; with
`stages.reasoner.colocate_with_generation` both stages run in one process.

The directory is the dev Cosmos3 generation checkpoint, which holds its reasoner (root
`config.json`) whose LLM is the generator's understanding pathway."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.streaming.support import SESSION_BODY, image_bytes
from tests.support.server import ServerProcess
from worldserve.models.dev import MARKER_NAME


def wait(http: httpx.Client, job_id: str, until: tuple[str, ...]) -> dict:
    for _ in range(1200):
        job = http.get(f"/v1/videos/{job_id}").json()
        if job["status"] in until:
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} stuck: {job}")


def chat(http: httpx.Client) -> tuple[str, int]:
    reply = http.post("/v1/chat/completions", json={
        "model": "cosmos3-both", "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 16, "temperature": 0.8, "seed": 3}, timeout=120)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    return body["choices"][0]["message"]["content"], body["usage"]["completion_tokens"]


@pytest.mark.parametrize("colocated", [False, True], ids=["two-processes", "colocated"])
def test_one_directory_serves_generation_and_reasoning(tmp_path: Path, dev_models_dir: Path,
                                                       colocated: bool) -> None:
    model = tmp_path / "cosmos3-both"
    shutil.copytree(dev_models_dir / "generation", model)
    (model / MARKER_NAME).unlink()  # served under the directory's name, like a real checkpoint
    config = {"stages": {"realtime": {"enabled": False},
                         "reasoner": {"colocate_with_generation": colocated}}}
    server = ServerProcess(tmp_path, config, args=["--model-path", str(model)])
    try:
        server.wait_healthy(timeout_s=120)
        with httpx.Client(base_url=server.base_url, timeout=60) as http:
            info = http.get("/admin/server_info").json()
            assert set(info["stages"]) == {"generation", "reasoner"}
            pids = server.stage_pids()
            assert (pids["generation"] == pids["reasoner"]) is colocated
            meta = http.get("/v1/metadata").json()
            assert meta["model_type"] == "reasoner"
            assert meta["inference_endpoint"] == "/v1/chat/completions"
            assert meta["selectedModelProfileId"] == "worldserve:cosmos3-both:hf:float32:nano"
            assert meta["model_variant"] == "nano"  # the dev checkpoint's size class
            assert meta["modelInfo"][0]["shortName"] == "cosmos3-both"
            assert http.get("/v1/streaming/config").json()["model"] == "cosmos3-both"
            assert "cosmos3-both" in {m["id"] for m in http.get("/v1/models").json()["data"]}
            created = http.post("/v1/streaming/sessions",
                                json={**SESSION_BODY, "sampling": {"max_tokens": 3}})
            assert created.status_code == 201, created.text
            session = created.json()["session_id"]
            reply = http.post(f"/v1/streaming/sessions/{session}/frame",
                              content=image_bytes(), headers={"content-type": "image/jpeg"})
            assert reply.status_code == 200, reply.text
            http.delete(f"/v1/streaming/sessions/{session}")
            image = http.post("/v1/images/generations", timeout=300, json={
                "prompt": "x", "size": "64x64", "num_inference_steps": 2})
            assert image.status_code == 200, image.text
            # a seeded reply while a video job denoises (colocated: run between its blocks)
            # equals the same reply with the generation idle
            video = http.post("/v1/videos", json={"prompt": "a robot", "size": "48x32",
                                                  "num_frames": 9,
                                                  "num_inference_steps": 400}).json()
            wait(http, video["id"], until=("in_progress",))
            during = chat(http)
            assert http.get(f"/v1/videos/{video['id']}").json()["status"] == "in_progress"
            http.delete(f"/v1/videos/{video['id']}")
            assert chat(http) == during
        # colocated: the reasoner holds no second copy of the understanding weights
        assert ("reasoner shares" in server.log()) is colocated
        # colocated (colocation_yield: blocks, the default): the generation forward yields
        # to the reasoner before each transformer block of the dev model (2 layers)
        assert ("the generation forward yields to reasoner before each of its 2 blocks"
                in server.log()) is colocated
    finally:
        server.stop()
