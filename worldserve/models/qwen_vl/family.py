"""Qwen-VL (Qwen2-VL, Qwen2.5-VL, Qwen3-VL through transformers): the reasoner."""

from __future__ import annotations

from pathlib import Path

from worldserve.models.detect import transformers_type
from worldserve.models.types import ModelFamily

MODEL_TYPES = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl"})


def detect(model_dir: Path) -> bool:
    return transformers_type(model_dir) in MODEL_TYPES


FAMILY = ModelFamily(
    name="qwen_vl",
    detect=detect,
    loaders={"reasoner": "worldserve.models.qwen_vl.runner:load_runner"},
)
