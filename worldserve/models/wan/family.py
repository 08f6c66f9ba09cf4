"""Wan (diffusers `WanPipeline` and its siblings): media generation."""

from __future__ import annotations

from pathlib import Path

from worldserve.ipc.capabilities import GenerationDefaults
from worldserve.models.detect import diffusers_class
from worldserve.models.dev import DEV_LIMITS
from worldserve.models.types import ModelFamily

# Wan 2.1/2.2 T2V at 480p, as the diffusers model cards use it.
DEFAULTS = GenerationDefaults(width=832, height=480, num_frames=81, fps=16,
                              num_inference_steps=50, guidance_scale=5.0, max_sequence_length=512,
                              image_width=832, image_height=480, image_response_format="url")
# The tiny dev checkpoint: sizes and steps that run in tens of milliseconds on a CPU.
DEV_DEFAULTS = GenerationDefaults(width=64, height=64, num_frames=9, fps=8, num_inference_steps=4,
                                  guidance_scale=1.0, max_sequence_length=64, image_width=64,
                                  image_height=64, image_response_format="url", **DEV_LIMITS)


def detect(model_dir: Path) -> bool:
    name = diffusers_class(model_dir)
    return name is not None and name.startswith("Wan") and name.endswith("Pipeline")


FAMILY = ModelFamily(
    name="wan",
    detect=detect,
    loaders={"generation": "worldserve.models.wan.runner:load_runner"},
)
