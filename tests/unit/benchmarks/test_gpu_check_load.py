"""gpu_check's `load` part on the CPU: both loaders (straight to the device, and the host copy
of before) run in child processes and report; on the CPU both load into host memory, so the
figures only say that the part works (docs/hardware.md: the CUDA comparison never ran here)."""

from __future__ import annotations

from pathlib import Path

from tests.unit.benchmarks.test_gpu_check import run_cpu


def test_cpu_load_part(dev_models_dir: Path, tmp_path: Path) -> None:
    done, result = run_cpu("load", tmp_path / "load.json")
    load = result["parts"]["load"]
    assert load["transformer_params"] > 0 and load["file_gib"] > 0
    for mode in ("direct", "host_copy"):
        assert load[mode]["devices"] == ["cpu"] and load[mode]["load_s"] > 0
        assert load[mode]["host_anon_peak_gib"] >= 0
    assert "load       direct: host anon peak GiB / s" in done.stderr
