"""benchmarks/gpu_check.py on the CPU with tiny sizes (its figures mean nothing here): from an
empty dev-model folder (what a bare GPU host has) every asked part runs through worldserve's
real runner and engines and reports what the GPU run will report; the runner keeps each part
within its time budget, and one failing part does not stop the others."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.server import REPO_ROOT, base_env

sys.path.insert(0, str(REPO_ROOT))

from benchmarks import gpu_check  # noqa: E402


def run_cpu(parts: str, out: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    """`gpu_check.py --device cpu --parts PARTS` as a child process; its run and its JSON."""
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu",
         "--parts", parts, "--out", str(out), *extra],
        capture_output=True, text=True, timeout=240, env=base_env(), cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done, json.loads(out.read_text())


def test_cpu_run_builds_its_dev_models_and_reports_every_part(tmp_path: Path) -> None:
    dev_models = tmp_path / "dev-models"  # empty, as on a bare host
    done, result = run_cpu("reasoner,plan,fp8,generator", tmp_path / "gpu_check.json",
                           "--dev-models", str(dev_models))
    assert json.loads(done.stdout.strip().splitlines()[-1]) == result  # the one JSON line
    assert result["device"] == "cpu" and result["small"] is True
    assert result["dev_models"]["dir"] == str(dev_models)
    assert (dev_models / "generation" / "model_index.json").is_file()
    parts = result["parts"]
    assert list(parts) == ["plan", "fp8", "generator", "reasoner", "load", "parallel"]
    assert parts["load"] == parts["parallel"] == {"skipped": "not asked (--parts)"}
    assert not [name for name, got in parts.items() if "error" in got]
    plan = parts["plan"]
    assert plan["gpus"] == [] and plan["nano"]["stages"]["generation"]["device"] == "cpu"
    assert plan["dev"]["stages"]["reasoner"]["dtype"] == "float32"
    fp8 = parts["fp8"]  # W8A8 forced on the CPU, decoded by the engine on both paths
    assert fp8["compute"].startswith("w8a8 (forced") and fp8["fp8_linears"] > 0
    assert set(fp8["engine"]) == {"static", "eager"} and fp8["static_equals_eager"] is True
    assert all(got["tokens"] > 0 for got in fp8["engine"].values())
    assert fp8["w8a8_vs_w8a16"] == {"skipped": "CUDA only (the _scaled_mm kernel)"}
    runs = parts["generator"]["runs"]
    assert parts["generator"]["backends"] == ["native"]  # the others are tried on CUDA only
    assert list(runs) == ["native/tiny"]
    assert runs["native/tiny"]["s_per_step"] > 0 and runs["native/tiny"]["vs_native"] == 1.0
    for batch, rows in (("b1", 1), ("b4", 4)):
        got = parts["reasoner"][batch]
        assert got["tokens"] >= rows and got["ms_per_token"] > 0
        graphed = parts["reasoner"]["graphs"][batch]  # replayed by rerunning on the CPU
        assert graphed["tokens"] >= rows and graphed["vs_static"] > 0
    graphs = parts["reasoner"]["graphs"]
    assert graphs["captures"] > 0 and graphs["replays"] > graphs["captures"]
    assert graphs["tokens_equal"] is True  # float32 on the CPU: whole buffers, same tokens
    assert "generator  native/tiny s/step (peak GiB)" in done.stderr


def _sleeper(seconds: float) -> int:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"]).pid


def test_each_part_runs_within_its_budget_and_a_failure_stops_none(tmp_path: Path) -> None:
    def fails(setup, tmp, out):
        out["before"] = 1
        raise ValueError("broken part")

    def hangs(setup, tmp, out):
        out["child"] = _sleeper(60)
        out["before"] = 2
        time.sleep(30)

    def fine(setup, tmp, out):
        out["figure"] = 3

    parts = {"fails": fails, "fine": fine, "hangs": hangs, "late": fine, "unasked": fine}
    # "hangs" may take 30 s, but only the 3 s left of the whole budget: "late" never starts
    budgets = {"fails": 5.0, "fine": 5.0, "hangs": 30.0, "late": 5.0, "unasked": 5.0}
    setup = argparse.Namespace(device="cpu", budget_s=3.0)
    import torch  # noqa: F401  (imported before the clock starts: parts' helpers use it)

    started = time.perf_counter()
    got = gpu_check.run_parts(setup, ["hangs", "late", "fine", "fails"], parts, budgets)
    assert time.perf_counter() - started < 15
    assert got["fails"]["before"] == 1 and got["fails"]["error"] == "ValueError: broken part"
    assert got["fine"]["figure"] == 3 and "error" not in got["fine"]
    assert got["hangs"]["before"] == 2 and got["hangs"]["error"].startswith("timed out: past")
    _, status = os.waitpid(got["hangs"]["child"], 0)  # the process it left was killed
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert got["hangs"]["budget_s"] <= 3.0
    assert got["late"] == {"skipped": "--budget-s 3 spent"}
    assert got["unasked"] == {"skipped": "not asked (--parts)"}


def test_an_unknown_part_is_a_usage_error() -> None:
    done = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "gpu_check.py"),
                           "--parts", "plan,bogus"], capture_output=True, text=True,
                          timeout=60, env=base_env(), cwd=REPO_ROOT)
    assert done.returncode == 2 and "unknown part(s) bogus" in done.stderr
    assert list(gpu_check.PARTS) == ["plan", "fp8", "generator", "reasoner", "load", "parallel"]
