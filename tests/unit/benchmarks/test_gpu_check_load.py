"""gpu_check's `load` part on the CPU: both loaders (straight to the device, and the host copy
of before) run in child processes and report; on the CPU both load into host memory, so the
figures only say that the part works (docs/hardware.md: the CUDA comparison never ran here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.server import REPO_ROOT, base_env


def test_tiny_load_part(dev_models_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / "gpu_check.py"), "--tiny",
         "--parts", "load", "--out", str(out)],
        capture_output=True, text=True, timeout=180, env=base_env(), cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    load = json.loads(out.read_text())["parts"]["load"]
    assert load["transformer_params"] > 0 and load["file_gib"] > 0
    for mode in ("direct", "host_copy"):
        assert load[mode]["devices"] == ["cpu"] and load[mode]["load_s"] > 0
        assert load[mode]["host_anon_peak_gib"] >= 0
    assert "load  direct: host anon peak GiB / s" in done.stdout
