"""Which GPUs this machine has, without importing torch in the calling process.

The api process (which never imports torch) asks a child process: `python -m
worldserve.runtime.devices` prints the CUDA devices torch sees as JSON, with torch's CUDA
version and, when it sees none, CUDA's own init error. On a machine without the NVIDIA driver (no
`/proc/driver/nvidia/gpus/*`, no `/dev/nvidiaN` for any N, no `/dev/nvidiactl`) nothing is
started: the inventory is empty at once, so CPU-only machines pay nothing for the probe.

A driver with no GPU torch can use (a CPU-only torch build, a driver older than torch's CUDA) is
a startup error for stages on `auto`, not a silent fp32 CPU plan: `--device cpu` says the CPU is
meant.

`resolve_in_process` is the fallback for engines built without the supervisor's plan (in-process
clients, Ray replicas, tests): it resolves `auto` with the torch the caller already imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from worldserve.config import ServerConfig
from worldserve.runtime.placement import (
    GpuInfo,
    PlacementPlan,
    plan_placement,
    visible_devices,
)

PROBE_TIMEOUT_S = 120.0
DRIVER_GPUS = Path("/proc/driver/nvidia/gpus")
DEVICE_DIR = Path("/dev")  # /dev/nvidiaN (a container may be given only /dev/nvidia3), nvidiactl


class DeviceProbeError(RuntimeError):
    """The GPU probe failed (the message says how)."""


@dataclass(frozen=True)
class Inventory:
    """What the probe found: the GPUs torch sees, whether an NVIDIA driver is there, torch's
    CUDA version (None: a CPU-only build) and CUDA's init error when it sees no GPU."""

    gpus: list[GpuInfo]
    driver: bool
    torch_cuda: str | None = None
    cuda_error: str | None = None


def nvidia_driver_present() -> bool:
    """An NVIDIA kernel driver with at least one GPU (file checks only)."""
    try:
        if DRIVER_GPUS.is_dir() and any(DRIVER_GPUS.iterdir()):
            return True
        return any(DEVICE_DIR.glob("nvidia[0-9]*")) or (DEVICE_DIR / "nvidiactl").exists()
    except OSError:
        return False


def probe_gpus() -> dict[str, Any]:
    """The CUDA devices torch sees in this process (imports torch), torch's CUDA version and,
    when it sees none, the error CUDA's initialisation gives (is_available() says only False)."""
    import torch

    report: dict[str, Any] = {"gpus": [], "torch_cuda": torch.version.cuda, "cuda_error": None}
    if not torch.cuda.is_available():
        try:
            torch.cuda.init()
            report["cuda_error"] = "torch.cuda.is_available() is False"
        except Exception as exc:  # the reason is the report; nothing else to do with it here
            report["cuda_error"] = f"{type(exc).__name__}: {exc}"
        return report
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        report["gpus"].append({"index": index, "name": props.name,
                               "total_bytes": int(props.total_memory),
                               "capability": [props.major, props.minor]})
    return report


def probe_inventory(timeout_s: float = PROBE_TIMEOUT_S) -> Inventory:
    """The GPUs torch would see in a stage process, asked of a child process when there is a
    driver (none without one, none with a CPU-only torch build)."""
    if not nvidia_driver_present():
        return Inventory([], driver=False)
    try:
        done = subprocess.run([sys.executable, "-m", "worldserve.runtime.devices"],
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise DeviceProbeError(f"the CUDA probe did not answer within {timeout_s:g} s") from None
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise DeviceProbeError(f"the CUDA probe failed: {tail}")
    report = json.loads(done.stdout)
    gpus = [GpuInfo(index=int(item["index"]), name=str(item["name"]),
                    total_bytes=int(item["total_bytes"]),
                    capability=(int(item["capability"][0]), int(item["capability"][1])))
            for item in report["gpus"]]
    return Inventory(gpus, True, report.get("torch_cuda"), report.get("cuda_error"))


def visible_gpus(timeout_s: float = PROBE_TIMEOUT_S) -> list[GpuInfo]:
    """The inventory the placement plan works with (`probe_inventory`)."""
    return probe_inventory(timeout_s).gpus


def require_gpus_for_auto(inventory: Inventory, auto_stages: list[str]) -> None:
    """A driver but no GPU torch can use, with stages on `auto`: a DeviceProbeError naming
    torch's CUDA build and CUDA's error, not a silent float32 CPU plan."""
    if not inventory.driver or inventory.gpus or not auto_stages:
        return
    build = (f"torch built for CUDA {inventory.torch_cuda}" if inventory.torch_cuda
             else "a CPU-only torch build (torch.version.cuda is None)")
    raise DeviceProbeError(
        f"an NVIDIA driver is present but torch sees no GPU ({build}; CUDA says: "
        f"{inventory.cuda_error or 'no error given'}), and stages {', '.join(auto_stages)} are "
        "on device auto. Install a torch build that matches the driver, or run on the CPU "
        "on purpose with --device cpu")


ConfigT = TypeVar("ConfigT")


def resolve_in_process(stage_config: ConfigT) -> ConfigT:
    """`stage_config` with `auto` device and dtype made concrete from this process's torch
    (cuda:0 + bfloat16 when a GPU is visible, else cpu + float32). A config the supervisor
    resolved already is returned as is."""
    device, dtype = stage_config.device, stage_config.dtype  # type: ignore[attr-defined]
    if device != "auto" and dtype != "auto":
        return stage_config
    from worldserve.models.common import resolve_device_names

    device, dtype = resolve_device_names(device, dtype)
    return stage_config.model_copy(update={"device": device, "dtype": dtype})  # type: ignore



def server_plan(config: ServerConfig, gpus: list[GpuInfo] | None = None
                ) -> tuple[PlacementPlan, dict[str, Any]]:
    """The plan for `config` on this machine's GPUs (or `gpus`), and each stage's facts
    (checkpoint_facts.StageFacts). File reads and the probe child only: no torch here."""
    from worldserve.runtime.checkpoint_facts import stage_demands

    demands, facts = stage_demands(config)
    if gpus is None:
        inventory = probe_inventory()
        require_gpus_for_auto(inventory, [d.stage for d in demands if d.device == "auto"])
        gpus = inventory.gpus
    return plan_placement(gpus, demands), facts


def apply_plan(config: ServerConfig, plan: PlacementPlan) -> ServerConfig:
    """`config` with each planned stage's device and dtype made concrete, as its process sees
    them (cuda:0.. inside its CUDA_VISIBLE_DEVICES, or cpu)."""
    data = config.model_dump(mode="json")
    for name, stage in plan.stages.items():
        data["stages"][name]["device"] = stage.stage_device
        data["stages"][name]["dtype"] = stage.dtype
    return ServerConfig.model_validate(data)


def stage_environment(plan: PlacementPlan, stage: str,
                      parent_visible: list[str] | None) -> dict[str, str]:
    """Environment variables a stage process starts with: CUDA_VISIBLE_DEVICES = its GPUs
    (an empty value hides every GPU from a stage planned on the CPU)."""
    planned = plan.stages.get(stage)
    if planned is None or not plan.gpus:
        return {}
    return {"CUDA_VISIBLE_DEVICES": visible_devices(planned.gpus, parent_visible)}


def main() -> int:
    print(json.dumps(probe_gpus()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
