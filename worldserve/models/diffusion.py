"""Load diffusers pipelines from local directories and describe their size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from diffusers import DiffusionPipeline

from worldserve.models.common import require_local_dir, resolve_dtype


def load_pipeline(
    model_dir: str | Path,
    dtype: torch.dtype | str = torch.float32,
    device: str | torch.device = "cpu",
) -> DiffusionPipeline:
    """Load the pipeline `model_index.json` names (e.g. WanPipeline) from a local directory.

    The progress bar is off: engines report per-step progress themselves.
    """
    path = require_local_dir(model_dir)
    pipe = DiffusionPipeline.from_pretrained(
        path, dtype=resolve_dtype(dtype), local_files_only=True
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device)


def count_parameters(obj: Any) -> int:
    """Number of parameters of a torch module, or of every module component of a pipeline."""
    if isinstance(obj, torch.nn.Module):
        return sum(p.numel() for p in obj.parameters())
    components = getattr(obj, "components", None)
    if isinstance(components, dict):
        modules = [c for c in components.values() if isinstance(c, torch.nn.Module)]
        return sum(count_parameters(m) for m in modules)
    raise TypeError(f"cannot count parameters of {type(obj).__name__}: pass a module or a pipeline")
