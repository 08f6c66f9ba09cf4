"""Helpers every model loader shares: local-only paths and dtype names."""

from __future__ import annotations

from pathlib import Path

import torch


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """`torch.bfloat16` from "bfloat16" (or pass a torch.dtype through)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, str(dtype), None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}: use float32, bfloat16 or float16")
    return resolved


def require_local_dir(model_dir: str | Path) -> Path:
    """`model_dir` as a Path; a clear error when it is not a local directory (no hub downloads)."""
    path = Path(model_dir).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(
            f"model directory {str(path)!r} does not exist: pass a local checkpoint folder "
            "(worldserve never downloads weights; run `worldserve dev-models build` for dev models)"
        )
    return path
