"""The operator routes through a real `worldserve serve` (stage process, ZeroMQ, admin key):
LoRA hot-load and a per-request adapter, a weight update, memory release shown by /health."""

from __future__ import annotations

import base64
import io
import time
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

from tests.integration.generation.conftest import gen_config
from tests.support.machine import require_module
from tests.support.server import ServerProcess
from tests.unit.generation import admin_fixtures as fx

require_module("peft")

KEY = "admin-k3y"
AUTH = {"Authorization": f"Bearer {KEY}"}
IMAGE = {"prompt": fx.PROMPT, "size": f"{fx.SIZE}x{fx.SIZE}", "num_inference_steps": fx.STEPS,
         "guidance_scale": 1.0, "max_sequence_length": 32, "seed": 7,
         "response_format": "b64_json"}


def pixels(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    data = base64.b64decode(response.json()["data"][0]["b64_json"])
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))[None]


def health_state(server: ServerProcess, want: str) -> dict:
    for _ in range(200):
        body = httpx.get(f"{server.base_url}/health", timeout=5).json()
        if body["stages"]["generation"] == want:
            return body
        time.sleep(0.05)
    raise AssertionError(f"/health never showed {want}: {body}")


def test_admin_routes_on_a_live_server(tmp_path: Path, gen_model_dir: Path) -> None:
    assets = tmp_path / "assets"
    lora = fx.build_lora(gen_model_dir, assets / "lora", 1, ["to_q", "to_k", "to_v", "to_out.0"])
    updated = fx.build_updated_weights(gen_model_dir, assets / "updated", 3)
    server = ServerProcess(tmp_path, gen_config(gen_model_dir),
                           env={"WORLDSERVE_ADMIN_KEY": KEY})
    try:
        server.wait_healthy()
        url = server.base_url
        assert httpx.get(f"{url}/admin/lora", timeout=5).status_code == 401
        # SGLang's LoRA routes keep the admin rules
        assert httpx.get(f"{url}/v1/list_loras", timeout=5).status_code == 401
        assert httpx.post(f"{url}/v1/set_lora", timeout=5,
                          json={"lora_nickname": "style"}).status_code == 401
        loaded = httpx.post(f"{url}/admin/lora/load", headers=AUTH, timeout=60,
                            json={"name": "style", "path": str(lora), "scale": 0.8})
        assert loaded.status_code == 200, loaded.text
        info = httpx.get(f"{url}/admin/model_info", headers=AUTH, timeout=10).json()
        assert info["stages"]["generation"]["lora"]["adapters"][0]["name"] == "style"
        styled = httpx.post(f"{url}/v1/images/generations", timeout=120,
                            json={**IMAGE, "lora": "style"})
        fx.assert_close_uint8(pixels(styled), fx.reference(
            gen_model_dir, 7, loras=[(lora, "style", 0.8)]))
        updated_reply = httpx.post(f"{url}/admin/weights/update", headers=AUTH, timeout=120,
                                   json={"path": str(updated)})
        assert updated_reply.status_code == 200, updated_reply.text
        base = httpx.post(f"{url}/v1/images/generations", timeout=120, json=IMAGE)
        fx.assert_close_uint8(pixels(base), fx.reference(
            gen_model_dir, 7, transformer_dir=updated / "transformer"))
        released = httpx.post(f"{url}/admin/memory/release", headers=AUTH, timeout=60)
        assert released.status_code == 200, released.text
        assert health_state(server, "released")["status"] == "released"
        refused = httpx.post(f"{url}/v1/images/generations", timeout=60, json=IMAGE)
        assert refused.status_code == 503
        assert "model weights released" in refused.json()["error"]["message"]
        resumed = httpx.post(f"{url}/admin/memory/resume", headers=AUTH, timeout=60)
        assert resumed.status_code == 200, resumed.text
        assert health_state(server, "ready")["status"] == "ok"
    finally:
        server.stop()
