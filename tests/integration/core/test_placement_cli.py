"""`worldserve check` and the startup placement plan, as real processes on this (CPU) machine."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.server import base_env


def worldserve(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "worldserve", *args], capture_output=True,
                          text=True, timeout=timeout, env=base_env(**env))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_check_json_on_the_dev_cosmos3_directory(dev_models_dir: Path) -> None:
    cosmos = dev_models_dir / "generation"
    done = worldserve("check", "--model-path", str(cosmos), "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    plan, stages = out["plan"], out["stages"]
    assert plan["fits"] is True and plan["gpus"] == []
    # one directory, both stages; the realtime stage (enabled by default) gets its dev model
    assert set(plan["stages"]) == {"generation", "reasoner", "realtime"}
    assert stages["realtime"]["family"] == "causal_dit"
    for name in ("generation", "reasoner"):
        assert plan["stages"][name]["device"] == "cpu"
        assert plan["stages"][name]["dtype"] == "float32"
        assert stages[name]["model_path"] == str(cosmos)
    assert stages["generation"]["family"] == "cosmos3"
    assert stages["reasoner"]["family"] == "cosmos3_reasoner"
    assert stages["generation"]["quantisation"] is None
    numel = stages["generation"]["dtype_numel"]
    assert plan["stages"]["generation"]["weight_bytes"] == 4 * numel["F32"]
    files = {f["path"]: f["bytes"] for f in stages["generation"]["files"]}
    assert files["transformer/diffusion_pytorch_model.safetensors"] == (
        cosmos / "transformer" / "diffusion_pytorch_model.safetensors").stat().st_size


def test_check_text_and_dtype_flag(dev_models_dir: Path) -> None:
    done = worldserve("check", "--model-path", str(dev_models_dir / "generation"),
                      "--dtype", "bfloat16")
    assert done.returncode == 0, done.stderr
    assert "generation: cosmos3, published" in done.stdout
    assert "generation: cpu bfloat16 weights" in done.stdout and "fits: yes" in done.stdout


@pytest.mark.parametrize(("args", "env", "named"), [
    (["--device", "cuda"], {}, "'cuda'"),
    ([], {"WORLDSERVE_DEVICE": "cuda:7"}, "'cuda:7'"),
])
def test_check_refuses_a_device_this_machine_lacks(dev_models_dir: Path, args: list[str],
                                                   env: dict[str, str], named: str) -> None:
    done = worldserve("check", "--model-path", str(dev_models_dir / "generation"), *args, **env)
    assert done.returncode == 1
    assert f"problem: stages.generation.device is {named} but no CUDA GPU is visible" in \
        done.stdout
    assert "fits: no" in done.stdout


def test_serve_with_a_missing_device_fails_startup_naming_it(dev_models_dir: Path) -> None:
    done = worldserve("serve", "--model-path", str(dev_models_dir / "generation"),
                      "--port", str(free_port()), "--device", "cuda", timeout=60)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("worldserve: the placement plan does not work: "
                           "stages.generation.device is 'cuda' but no CUDA GPU is visible")
    assert "started stage" not in done.stderr  # nothing was loaded
    assert "placement: fits: no" in done.stderr  # the plan is logged first


def test_a_device_that_is_no_device_is_a_usage_error() -> None:
    done = worldserve("check", "--device", "gpu0")
    assert done.returncode == 2
    assert "stages.generation.device: device 'gpu0' is not one of auto, cpu, cuda, cuda:N" in \
        done.stderr
