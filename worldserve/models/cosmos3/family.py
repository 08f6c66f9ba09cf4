"""Cosmos3 (diffusers `Cosmos3OmniPipeline`): images, videos with sound, robot actions; on the
realtime stage (when configured there), camera_pose forward-dynamics world sessions."""

from __future__ import annotations

from pathlib import Path

from worldserve.models.detect import diffusers_class
from worldserve.models.types import ModelFamily

PIPELINE_CLASS = "Cosmos3OmniPipeline"


def detect(model_dir: Path) -> bool:
    return diffusers_class(model_dir) == PIPELINE_CLASS


FAMILY = ModelFamily(
    name="cosmos3",
    detect=detect,
    loaders={"generation": "worldserve.models.cosmos3.runner:load_runner",
             "realtime": "worldserve.models.cosmos3.world:load_runner",
             # one rank of a generation rank group (stages.generation.parallel)
             "generation_ranks": "worldserve.models.cosmos3.parallel:load_rank_runner"},
    explicit_kinds=frozenset({"realtime", "generation_ranks"}),
)
