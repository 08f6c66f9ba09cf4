"""The GPU gate before the placement plan: which files mean an NVIDIA driver, what the probe
reports when torch sees no GPU, and that a driver without a usable GPU stops `auto` instead of
planning every stage on the CPU in float32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from worldserve.config import ServerConfig
from worldserve.runtime import devices
from worldserve.runtime.devices import DeviceProbeError, Inventory, require_gpus_for_auto
from worldserve.runtime.placement import GpuInfo


@pytest.fixture
def fake_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """/proc/driver/nvidia/gpus and /dev, both empty, under tmp_path."""
    monkeypatch.setattr(devices, "DRIVER_GPUS", tmp_path / "proc" / "gpus")
    (tmp_path / "dev").mkdir()
    monkeypatch.setattr(devices, "DEVICE_DIR", tmp_path / "dev")
    return tmp_path


@pytest.mark.parametrize("present, expected", [
    ((), False),
    (("nvidia3",), True),  # a container given only its fourth GPU
    (("nvidiactl",), True),
    (("nvidia-uvm", "nvidia-modeset"), False),  # not GPUs
    (("proc/gpus/0000:3b:00.0",), True),
])
def test_driver_gate(fake_root: Path, present: tuple[str, ...], expected: bool) -> None:
    for name in present:
        path = fake_root / (name if "/" in name else f"dev/{name}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    assert devices.nvidia_driver_present() is expected


def test_a_driver_without_a_usable_gpu_stops_auto_naming_the_cause() -> None:
    mismatch = Inventory([], True, "13.0", "RuntimeError: The NVIDIA driver on your system is "
                                           "too old (found version 12020)")
    with pytest.raises(DeviceProbeError) as caught:
        require_gpus_for_auto(mismatch, ["generation", "reasoner"])
    message = str(caught.value)
    assert "torch built for CUDA 13.0" in message and "too old (found version 12020)" in message
    assert "generation, reasoner" in message and "--device cpu" in message
    with pytest.raises(DeviceProbeError, match="CPU-only torch build"):
        require_gpus_for_auto(Inventory([], True, None, "AssertionError: Torch not compiled "
                                                        "with CUDA enabled"), ["reasoner"])
    require_gpus_for_auto(mismatch, [])  # every stage on the CPU by choice
    require_gpus_for_auto(Inventory([], False), ["reasoner"])  # no driver: the CPU machine
    gpu = GpuInfo(0, "NVIDIA H100", 80 << 30, (9, 0))
    require_gpus_for_auto(Inventory([gpu], True, "13.0"), ["reasoner"])


def test_server_plan_applies_the_gate_and_device_cpu_is_the_way_out(monkeypatch) -> None:
    broken = Inventory([], True, "13.0", "RuntimeError: no CUDA-capable device is detected")
    monkeypatch.setattr(devices, "probe_inventory", lambda: broken)
    with pytest.raises(DeviceProbeError, match="no CUDA-capable device"):
        devices.server_plan(ServerConfig())
    on_cpu = ServerConfig.model_validate({"stages": {
        name: {"device": "cpu"} for name in ("generation", "reasoner", "realtime")}})
    plan, _ = devices.server_plan(on_cpu)
    assert plan.fits and all(s.device == "cpu" for s in plan.stages.values())


def test_the_probe_reports_torchs_cuda_build_and_the_init_error() -> None:
    """Without a usable GPU (this machine, CI) the probe names torch's CUDA build and CUDA's
    init error; with one, it lists the GPUs and no error."""
    report = devices.probe_gpus()
    assert report["torch_cuda"] == torch.version.cuda
    if torch.cuda.is_available():
        assert len(report["gpus"]) == torch.cuda.device_count() and not report["cuda_error"]
    else:
        assert report["gpus"] == [] and report["cuda_error"]
