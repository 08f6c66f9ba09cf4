"""`make wheelhouse` (an offline install for a GPU host with its own CUDA torch): the requirement
list it downloads, and the download command for a target Python, read with `make -n` (nothing
is downloaded here)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tools.wheelhouse import requirements

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_the_list_drops_what_a_cuda_torch_host_brings() -> None:
    lock = "\n".join([
        "# a comment", "", "numpy==2.4.6", "torch==2.13.0+cpu", "triton==3.6.0",
        "nvidia-cublas-cu12==12.8.4.1", "nvidia_cudnn_cu12==9.10.2.21", "nvidia-nccl==2.29.1",
        "cuda-bindings==13.0.3", "nvidia-modelopt==0.47.0", "nvidia_ml_py==13.615.71",
        "Jinja2==3.1.6"])
    assert requirements(lock) == ["numpy==2.4.6", "nvidia-modelopt==0.47.0",
                                  "nvidia_ml_py==13.615.71", "Jinja2==3.1.6"]


def test_the_lock_gives_every_pin_but_torch() -> None:
    lock = (REPO_ROOT / "requirements" / "lock.txt").read_text()
    pins = [line for line in lock.splitlines() if line and not line.startswith("#")]
    kept = requirements(lock)
    assert [p for p in pins if p not in kept] == ["torch==2.13.0+cpu"]
    assert "setuptools" in {p.split("==")[0] for p in kept}  # the -e . build backend, offline


def test_make_downloads_wheels_only_for_the_target_python() -> None:
    done = subprocess.run(["make", "-n", "wheelhouse", "PY=3.12", "BIN=.venv/bin"],
                          capture_output=True, text=True, timeout=60, cwd=REPO_ROOT, check=True)
    command = " ".join(done.stdout.replace("\\\n", " ").split())
    assert "-m tools.wheelhouse requirements/lock.txt > wheelhouse/requirements.txt" in command
    assert ("pip download --no-deps --only-binary=:all: --python-version 3.12 "
            "--implementation cp --abi cp312 --platform manylinux_2_31_x86_64 ") in command
    for tag in ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"):
        assert f"--platform {tag} " in command
    assert "-r wheelhouse/requirements.txt -d wheelhouse" in command
    assert "pip install --no-index --find-links wheelhouse -e ." in command
