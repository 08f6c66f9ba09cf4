"""The flow-matching action head (`<generation model>/action_head/`): action chunks."""

from __future__ import annotations

from pathlib import Path

from worldserve.models.detect import CONFIG, read_json
from worldserve.models.types import ModelFamily

_KEYS = ("action_dim", "action_horizon", "state_dim")
SUBDIR = "action_head"  # where a generation checkpoint carries its (optional) action head


def detect(model_dir: Path) -> bool:
    config = read_json(model_dir / CONFIG) or {}
    return "model_type" not in config and all(key in config for key in _KEYS)


FAMILY = ModelFamily(
    name="action_head",
    detect=detect,
    loaders={"actions": "worldserve.models.action_head.runner:load_runner"},
)
