"""benchmarks/gpu_check.py end to end on the CPU with tiny shapes (its figures mean nothing
here; the test checks that every part runs through worldserve's real runner and engine and
reports what the GPU run will report)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.server import REPO_ROOT, base_env


def run_tiny(parts: str, out: Path) -> tuple[subprocess.CompletedProcess, dict]:
    """`gpu_check.py --tiny --parts PARTS` as a child process; its run and its JSON file."""
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / "gpu_check.py"), "--tiny",
         "--parts", parts, "--out", str(out)],
        capture_output=True, text=True, timeout=180, env=base_env(), cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    return done, json.loads(out.read_text())


def test_tiny_run_reports_every_part(dev_models_dir: Path, tmp_path: Path) -> None:
    done, result = run_tiny("plan,generator,reasoner", tmp_path / "gpu_check.json")
    assert json.loads(done.stdout.strip().splitlines()[-1]) == result
    assert result["tiny"] is True and result["cuda"] is False
    parts = result["parts"]
    assert list(parts) == ["plan", "generator", "reasoner"]
    assert not [name for name, got in parts.items() if "error" in got]
    plan = parts["plan"]
    assert plan["gpus"] == [] and plan["nano"]["stages"]["generation"]["device"] == "cpu"
    assert plan["dev"]["stages"]["reasoner"]["dtype"] == "float32"
    runs = parts["generator"]["runs"]
    assert list(runs) == ["native/tiny"]  # other backends are tried on CUDA only
    assert runs["native/tiny"]["s_per_step"] > 0 and runs["native/tiny"]["vs_native"] == 1.0
    for batch, rows in (("b1", 1), ("b4", 4)):
        got = parts["reasoner"][batch]
        assert got["tokens"] >= rows and got["ms_per_token"] > 0
    assert "generator  native/tiny s/step (peak GiB)" in done.stdout


def test_the_registry_names_every_part() -> None:
    sys.path.insert(0, str(REPO_ROOT))
    from benchmarks import gpu_check

    expected = {"plan", "load", "generator", "reasoner", "parallel"}
    if (REPO_ROOT / "benchmarks" / "fp8.py").is_file():
        expected.add("fp8")
    assert set(gpu_check.PARTS) == expected
    done = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "gpu_check.py"),
                           "--parts", "plan,bogus"], capture_output=True, text=True,
                          timeout=60, env=base_env(), cwd=REPO_ROOT)
    assert done.returncode == 2 and "unknown part(s) bogus" in done.stderr
