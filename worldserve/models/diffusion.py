"""Load diffusers pipelines from local directories and describe their size."""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import DiffusionPipeline

from worldserve.models.common import count_parameters, require_local_dir, resolve_dtype

__all__ = ["count_parameters", "load_pipeline"]


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
