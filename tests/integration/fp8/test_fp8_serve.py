"""`worldserve serve --model-path <FP8 Cosmos3 directory>` (real server, real stage process,
CPU, W8A16): the image and the greedy chat reply equal those of the same directory with the
dequantised weights written as a plain checkpoint; a checkpoint missing a scale fails startup
with the stage's message."""

from __future__ import annotations

import base64
import io
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image
from safetensors.torch import load_file, save_file

from tests.support.fp8_dirs import fp8_pair
from tests.support.server import ServerProcess

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
# both stages in one process: one start per server (the reasoner shares the dequantised LLM)
# and a tiny warmup (the default one runs the checkpoint's default size: long on a CPU)
CONFIG = {"stages": {"realtime": {"enabled": False},
                     "generation": {"warmup_resolutions": ["32x32"]},
                     "reasoner": {"colocate_with_generation": True}}}


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    from worldserve.models.cosmos3.dev import build_generation

    base = tmp_path_factory.mktemp("cosmos3-both")
    build_generation(base, 0)
    return fp8_pair(base, tmp_path_factory.mktemp("exported"), "exported")


def served(server: ServerProcess) -> tuple[np.ndarray, str]:
    with httpx.Client(base_url=server.base_url, timeout=300) as http:
        image = http.post("/v1/images/generations", json={
            "prompt": "a red cup", "size": "32x32", "num_inference_steps": 2, "seed": 7})
        assert image.status_code == 200, image.text
        png = base64.b64decode(image.json()["data"][0]["b64_json"])
        model = http.get("/v1/models").json()["data"][0]["id"]
        chat = http.post("/v1/chat/completions", json={
            "model": model, "messages": [{"role": "user", "content": "Describe a red cup."}],
            "max_tokens": 12, "temperature": 0})
        assert chat.status_code == 200, chat.text
    return np.asarray(Image.open(io.BytesIO(png))), chat.json()["choices"][0]["message"]["content"]


def test_fp8_server_serves_what_the_dequantised_checkpoint_serves(pair, tmp_path):
    quantised, reference = pair
    servers = [ServerProcess(tmp_path / name, CONFIG, args=["--model-path", str(path)])
               for name, path in (("fp8", quantised), ("ref", reference))
               if (tmp_path / name).mkdir() is None]
    try:
        for server in servers:
            server.wait_healthy(timeout_s=180)
        (fp8_image, fp8_reply), (ref_image, ref_reply) = (served(s) for s in servers)
        assert "loaded W8A16: 36 quantised linears" in servers[0].log()
        assert "loaded W8A16: 28 quantised linears" in servers[0].log()
        assert "W8A16" not in servers[1].log()
    finally:
        for server in servers:
            server.stop()
    # identical weights (tests/unit/fp8); the CPU kernels' last float bits depend on where the
    # weights sit in memory, so a pixel may round to the next uint8 level, nothing more
    diff = np.abs(fp8_image.astype(int) - ref_image.astype(int))
    assert diff.max() <= 1 and (diff == 0).mean() > 0.99
    assert fp8_reply == ref_reply and fp8_reply


def test_a_missing_scale_fails_startup_naming_the_linear(pair, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(pair[0], broken)
    shard = broken / "transformer" / "diffusion_pytorch_model.safetensors"
    tensors = load_file(shard)
    del tensors["layers.0.self_attn.to_q.weight_scale"]
    save_file(tensors, shard)
    (tmp_path / "server").mkdir()
    server = ServerProcess(tmp_path / "server", CONFIG, args=["--model-path", str(broken)])
    try:
        with pytest.raises(RuntimeError, match="server exited") as failed:
            server.wait_healthy(timeout_s=180)
    finally:
        server.stop()
    assert server.proc.returncode != 0
    assert ("layers.0.self_attn.to_q.weight is FP8 E4M3 but its scale"
            in str(failed.value))
