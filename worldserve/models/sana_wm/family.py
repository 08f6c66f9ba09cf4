"""SANA-WM (diffusers `SanaWMPipeline`, optional `refiner/` SanaWMLTX2Refiner): realtime sessions
as chunked image-to-video restarts with camera actions."""

from __future__ import annotations

from pathlib import Path

from worldserve.models.detect import diffusers_class
from worldserve.models.types import ModelFamily

PIPELINE_NAME = "SanaWMPipeline"
REFINER_DIR = "refiner"  # optional sub-directory holding a SanaWMLTX2Refiner


def detect(model_dir: Path) -> bool:
    return diffusers_class(model_dir) == PIPELINE_NAME


FAMILY = ModelFamily(
    name="sana_wm",
    detect=detect,
    loaders={"realtime": "worldserve.models.sana_wm.runner:load_runner"},
)
