"""Which GPUs this machine has, without importing torch in the calling process.

The api process (which never imports torch) asks a child process: `python -m
worldserve.runtime.devices` prints the CUDA devices torch sees as JSON. On a machine without the
NVIDIA driver (no `/proc/driver/nvidia/gpus/*`, no `/dev/nvidia0`) nothing is started: the
inventory is empty at once, so CPU-only machines pay nothing for the probe.

`resolve_in_process` is the fallback for engines built without the supervisor's plan (in-process
clients, Ray replicas, tests): it resolves `auto` with the torch the caller already imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
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
DRIVER_DEVICE = Path("/dev/nvidia0")


class DeviceProbeError(RuntimeError):
    """The GPU probe failed (the message says how)."""


def nvidia_driver_present() -> bool:
    """An NVIDIA kernel driver with at least one GPU (file checks only)."""
    try:
        if DRIVER_GPUS.is_dir() and any(DRIVER_GPUS.iterdir()):
            return True
    except OSError:
        pass
    return DRIVER_DEVICE.exists()


def probe_gpus() -> list[dict[str, Any]]:
    """The CUDA devices torch sees in this process (imports torch)."""
    import torch

    if not torch.cuda.is_available():
        return []
    out = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        out.append({"index": index, "name": props.name, "total_bytes": int(props.total_memory),
                    "capability": [props.major, props.minor]})
    return out


def visible_gpus(timeout_s: float = PROBE_TIMEOUT_S) -> list[GpuInfo]:
    """The inventory the placement plan works with: GPUs torch would see in a stage process
    (none without the driver, none with a CPU-only torch build)."""
    if not nvidia_driver_present():
        return []
    try:
        done = subprocess.run([sys.executable, "-m", "worldserve.runtime.devices"],
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise DeviceProbeError(f"the CUDA probe did not answer within {timeout_s:g} s") from None
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise DeviceProbeError(f"the CUDA probe failed: {tail}")
    return [GpuInfo(index=int(item["index"]), name=str(item["name"]),
                    total_bytes=int(item["total_bytes"]),
                    capability=(int(item["capability"][0]), int(item["capability"][1])))
            for item in json.loads(done.stdout)]


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
    return plan_placement(visible_gpus() if gpus is None else gpus, demands), facts


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
