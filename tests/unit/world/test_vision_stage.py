"""The reasoner's vision stage (tools/world_training/vision_stage.py) trains the reasoner's own
tensors only: its LLM is the generator transformer's understanding pathway, so a step of the
stage must move the vision tower and leave every transformer tensor bit-identical."""

from __future__ import annotations

import torch

from tools.world_training.vision_stage import VisionStageConfig, train_vision_stage


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_a_vision_stage_step_moves_only_the_reasoners_own_tensors(tied) -> None:
    generator, reasoner = tied
    transformer = generator.pipe.transformer
    reasoner_before, transformer_before = snapshot(reasoner.model), snapshot(transformer)
    cfg = VisionStageConfig(steps=1, pool_clips=2, stream_clips=1, num_eval=1)
    record = train_vision_stage(generator, reasoner, cfg, log=lambda entry: None)
    after = transformer.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in transformer_before.items())
    changed = [k for k, v in reasoner.model.state_dict().items()
               if not torch.equal(v, reasoner_before[k])]
    assert changed and all(k.startswith("model.visual.") for k in changed), changed
    assert all(p.requires_grad for p in transformer.parameters())  # the freeze is undone
    assert record["history"][-1]["step"] == 1
