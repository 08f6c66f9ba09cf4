"""Wan (diffusers `WanPipeline` and its siblings): media generation."""

from __future__ import annotations

from pathlib import Path

from worldserve.models.detect import diffusers_class
from worldserve.models.types import ModelFamily


def detect(model_dir: Path) -> bool:
    name = diffusers_class(model_dir)
    return name is not None and name.startswith("Wan") and name.endswith("Pipeline")


FAMILY = ModelFamily(
    name="wan",
    detect=detect,
    loaders={"generation": "worldserve.models.wan.runner:load_runner"},
)
