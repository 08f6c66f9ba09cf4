"""The DFlash drafter trained against the world reasoner, shipped with worldserve.

`weights/world_drafter.safetensors` (beside the trained world weights, models/dev/world/) holds
the drafter's tensors and `weights/world_drafter.json` its config and what training measured
(tools/world_training/train_drafter.py). The dev builder `world-drafter` writes the drafter
directory from them in seconds; serve it with `--streaming-spec-method dflash
--streaming-spec-model-path <dev-models>/world-drafter` beside `<dev-models>/world`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from worldserve.models.dev.world.trained import WEIGHTS_DIR, MissingWeights

WEIGHTS_NAME = "world_drafter.safetensors"
MANIFEST_NAME = "world_drafter.json"


def save(drafter: Any, out_dir: Path, figures: dict[str, Any]) -> None:
    """Write the drafter's tensors and its manifest (its config and `figures`)."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous() for k, v in drafter.state_dict().items()}
    save_file(tensors, str(out_dir / WEIGHTS_NAME), metadata={"format": "pt"})
    manifest = {"drafter_config": drafter.config.to_diff_dict(), **figures}
    (out_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")


def build_world_drafter(target: Path, seed: int, weights_dir: Path = WEIGHTS_DIR) -> None:
    """The dev builder: the trained drafter as a MuseGlimmerAssistantModel directory (every
    tensor is the trained one; `seed` only seeds the initialisation they replace, so the
    caller's RNG is left alone)."""
    from safetensors.torch import load_file
    from transformers import MuseGlimmerAssistantConfig

    from worldserve.models.dflash.dev import new_drafter

    weights, manifest = Path(weights_dir) / WEIGHTS_NAME, Path(weights_dir) / MANIFEST_NAME
    if not weights.is_file() or not manifest.is_file():
        raise MissingWeights(f"the trained world drafter is missing: {weights} "
                             "(run `python -m tools.world_training.train_drafter` to make it)")
    config = json.loads(manifest.read_text(encoding="utf-8"))["drafter_config"]
    model = new_drafter(MuseGlimmerAssistantConfig.from_dict(config), seed)
    model.load_state_dict(load_file(str(weights)), strict=True)
    model.save_pretrained(target)
