"""The generator's action stage (tools/world_training/action_stage.py): it trains on what serving
packs (an action request's given frame and actions are the stage's clean tokens), moves the
action heads and leaves every reasoner tensor bit-identical."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tools.world_training.action_stage import (
    ActionStageConfig,
    action_params,
    clean_latents,
    padded_actions,
    train_action_stage,
)
from worldserve.models.cosmos3_reasoner.text_pathway import reasoner_key
from worldserve.models.dev.world.scenes import make_clip


@pytest.fixture(scope="module")
def tied(tmp_path_factory: pytest.TempPathFactory):
    from worldserve.models.cosmos3.dev import build_world
    from worldserve.models.cosmos3.runner import load_runner as load_generator
    from worldserve.models.cosmos3_reasoner.loader import load_runner as load_reasoner

    target = tmp_path_factory.mktemp("world")
    build_world(Path(target), 0)
    generator = load_generator(target)
    return generator, load_reasoner(target, generator=generator.pipe.transformer)


def test_forward_dynamics_is_trained_on_the_tokens_serving_gives(tied) -> None:
    generator, _ = tied
    clip = make_clip(3, "agent")
    row = generator._prepare_row(action_params(clip, "forward_dynamics", 2, 3.0), 0)
    clean = clean_latents(generator.pipe, clip.frames)
    given = row.vision_mask[:, 0, 0] > 0
    assert given.tolist() == [True] + [False] * (len(given) - 1)
    assert torch.allclose(row.latents[0][:, given], clean[:, given], atol=1e-5)
    assert torch.equal(row.action_latents, padded_actions(clip, row.action_latents.shape[-1]))
    assert bool((row.action_mask == 1).all())


def test_inverse_dynamics_generates_the_actions_from_the_whole_clip(tied) -> None:
    generator, _ = tied
    clip = make_clip(4, "agent")
    row = generator._prepare_row(action_params(clip, "inverse_dynamics", 2, 3.0), 0)
    assert bool((row.vision_mask == 1).all()) and bool((row.action_mask == 0).all())
    assert clean_latents(generator.pipe, clip.frames).shape == row.latents.shape[1:]


def test_an_action_stage_step_moves_the_action_heads_and_no_reasoner_tensor(tied) -> None:
    generator, reasoner = tied
    transformer = generator.pipe.transformer
    reasoner_before = {k: v.clone() for k, v in reasoner.model.state_dict().items()}
    transformer_before = {k: v.clone() for k, v in transformer.state_dict().items()}
    record = train_action_stage(generator, reasoner,
                                ActionStageConfig(steps=1, pool_clips=3, eval_every=0),
                                log=lambda entry: None)
    after = reasoner.model.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in reasoner_before.items())
    changed = [k for k, v in transformer.state_dict().items()
               if not torch.equal(v, transformer_before[k])]
    assert any(k.startswith("action_") for k in changed), changed
    assert all(reasoner_key(k, reasoner.model.config.model_type) is None for k in changed)
    assert all(p.requires_grad for p in transformer.parameters())  # the freeze is undone
    assert record["cpu_min"] >= 0 and record["history"] == []
