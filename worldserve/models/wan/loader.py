"""Load a Wan diffusers pipeline (`model_index.json`) from a local directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from worldserve.models.common import direct_device_map, require_local_dir, resolve_dtype

# What the step-wise runner calls on the pipeline (WanPipeline-style pipelines have them all).
REQUIRED_ATTRIBUTES = ("transformer", "vae", "encode_prompt", "prepare_latents")


def load_pipeline(
    model_dir: str | Path,
    dtype: torch.dtype | str = torch.float32,
    device: str | torch.device = "cpu",
) -> Any:
    """Load the pipeline `model_index.json` names (e.g. WanPipeline) from a local directory,
    refused unless it is Wan-like. Progress bars are off: engines report per-step progress."""
    from diffusers import DiffusionPipeline
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()
    path = require_local_dir(model_dir)
    pipe = DiffusionPipeline.from_pretrained(
        path, dtype=resolve_dtype(dtype), local_files_only=True,
        device_map=direct_device_map(device),  # straight to the device (models/common.py)
    )
    pipe.set_progress_bar_config(disable=True)
    for name in REQUIRED_ATTRIBUTES:
        if not hasattr(pipe, name):
            raise ValueError(f"{type(pipe).__name__} has no {name}: worldserve drives Wan-family "
                             "(WanPipeline-style) video pipelines")
    return pipe.to(device)  # a no-op for what device_map placed already
