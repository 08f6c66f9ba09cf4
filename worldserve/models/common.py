"""Helpers every model loader shares: local-only paths, dtype names, parameter counts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """`torch.bfloat16` from "bfloat16" (or pass a torch.dtype through)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, str(dtype), None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}: use float32, bfloat16 or float16")
    return resolved


def resolve_device_names(device: str, dtype: str) -> tuple[str, str]:
    """(device, dtype) with `auto` made concrete from this process's torch: cuda:0 and
    bfloat16 when a GPU is visible, else cpu and float32 (config.resolve_dtype_name)."""
    from worldserve.config import resolve_dtype_name

    capability = None
    if device == "auto":
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and dtype == "auto" and torch.cuda.is_available():
        capability = torch.cuda.get_device_capability(torch.device(device))
    return device, resolve_dtype_name(dtype, device, capability)


def direct_device_map(device: str | torch.device) -> str | None:
    """The `device_map` with which diffusers' `from_pretrained` puts every tensor straight on
    `device` as it reads the shards (accelerate's meta-device init, no full host copy first).

    diffusers 0.42 accepts a device *type* only ("cpu", or the accelerator type, meaning the
    current device): "cuda" is right whenever `device` is the current CUDA device, which is
    cuda:0 in a stage process (the placement plan sets CUDA_VISIBLE_DEVICES) and cuda:r in a
    peer rank after its `torch.cuda.set_device`. Another index gets None: the pipeline is then
    read into host memory and moved (`pipe.to(device)`)."""
    target = torch.device(device)
    if target.type == "cpu":
        return "cpu"
    if target.type != "cuda":
        return None
    current = torch.cuda.current_device() if torch.cuda.is_available() else 0
    return "cuda" if target.index is None or target.index == current else None


def require_local_dir(model_dir: str | Path) -> Path:
    """`model_dir` as a Path; a clear error when it is not a local directory (no hub downloads)."""
    path = Path(model_dir).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(
            f"model directory {str(path)!r} does not exist: pass a local checkpoint folder "
            "(worldserve never downloads weights; run `worldserve dev-models build` for dev models)"
        )
    return path


def count_parameters(obj: Any) -> int:
    """Number of parameters of a torch module, or of every module component of a pipeline."""
    if isinstance(obj, torch.nn.Module):
        return sum(p.numel() for p in obj.parameters())
    components = getattr(obj, "components", None)
    if isinstance(components, dict):
        modules = [c for c in components.values() if isinstance(c, torch.nn.Module)]
        return sum(count_parameters(m) for m in modules)
    raise TypeError(f"cannot count parameters of {type(obj).__name__}: pass a module or a pipeline")
