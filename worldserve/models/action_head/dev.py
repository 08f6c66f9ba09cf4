"""Dev checkpoint builder of the flow-matching action head (random weights, fixed seed)."""

from __future__ import annotations

from pathlib import Path

import torch

from worldserve.models.action_head.model import ActionHead, ActionHeadConfig, save_action_head


def build_action_head(target: Path, seed: int,
                      config: ActionHeadConfig = ActionHeadConfig()) -> None:
    """Builder for the dev checkpoint: write a seeded random head into `target`."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        save_action_head(ActionHead(config), Path(target))
    finally:
        torch.random.set_rng_state(generator_state)
