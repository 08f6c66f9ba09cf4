"""`worldserve serve --model-path DIR` with a generator (`model_index.json`) and a Cosmos3
reasoner (`config.json`, model_type cosmos3_omni) in one directory starts both stages with no
further flags, and every model listing names the directory's model.

The generator is the dev Wan pipeline until the Cosmos3 generation family's dev directory
(which writes the reasoner files the same way) replaces it here."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx

from tests.integration.streaming.support import SESSION_BODY, image_bytes
from tests.support.server import ServerProcess
from worldserve.models.cosmos3_reasoner.dev import write_reasoner_files
from worldserve.models.dev import MARKER_NAME


def test_one_directory_serves_generation_and_reasoning(tmp_path: Path,
                                                       dev_models_dir: Path) -> None:
    model = tmp_path / "cosmos3-both"
    shutil.copytree(dev_models_dir / "generation", model)
    (model / MARKER_NAME).unlink()  # served under the directory's name, like a real checkpoint
    write_reasoner_files(model, 0)
    config = {"stages": {"realtime": {"enabled": False}}}
    server = ServerProcess(tmp_path, config, args=["--model-path", str(model)])
    try:
        server.wait_healthy(timeout_s=120)
        with httpx.Client(base_url=server.base_url, timeout=60) as http:
            info = http.get("/admin/server_info").json()
            assert set(info["stages"]) == {"generation", "reasoner"}
            meta = http.get("/v1/metadata").json()
            assert meta["model_type"] == "reasoner"
            assert meta["inference_endpoint"] == "/v1/chat/completions"
            assert meta["selectedModelProfileId"] == "worldserve:cosmos3-both:hf:float32"
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
    finally:
        server.stop()
