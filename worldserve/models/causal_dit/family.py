"""The project's causal DiT world model (Self-Forcing-style causal Wan): realtime sessions."""

from __future__ import annotations

from pathlib import Path

from worldserve.models.detect import REALTIME_CONFIG, read_json
from worldserve.models.types import ModelFamily

# Same value as loader.PIPELINE_NAME; repeated here so detection imports no torch.
PIPELINE_NAME = "WorldserveCausalWanPipeline"


def detect(model_dir: Path) -> bool:
    config = read_json(model_dir / REALTIME_CONFIG)
    return config is not None and config.get("pipeline", PIPELINE_NAME) == PIPELINE_NAME


FAMILY = ModelFamily(
    name="causal_dit",
    detect=detect,
    loaders={"realtime": "worldserve.models.causal_dit.runner:load_runner"},
)
