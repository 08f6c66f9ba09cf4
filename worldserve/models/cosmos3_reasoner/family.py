"""Cosmos3 reasoners: a `config.json` with `model_type` `cosmos3_omni` or `cosmos3_edge`.

The same directory may also hold the Cosmos3 generator (`model_index.json`): the generation
stage resolves that to the generator family, the reasoner stage to this one.
"""

from __future__ import annotations

from pathlib import Path

from worldserve.models.detect import transformers_type
from worldserve.models.types import ModelFamily

OMNI, EDGE = "cosmos3_omni", "cosmos3_edge"
MODEL_TYPES = frozenset({OMNI, EDGE})


def detect(model_dir: Path) -> bool:
    return transformers_type(model_dir) in MODEL_TYPES


FAMILY = ModelFamily(
    name="cosmos3_reasoner",
    detect=detect,
    loaders={"reasoner": "worldserve.models.cosmos3_reasoner.loader:load_runner"},
    profiles={"reasoner": "worldserve.models.cosmos3.profile:reasoner_profile"},
)
