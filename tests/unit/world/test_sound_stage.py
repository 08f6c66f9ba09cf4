"""The generator's sound stage (tools/world_training/sound_stage.py) trains the generation pathway
only: the reasoner's LLM is the transformer's understanding pathway, so a step of the stage must
leave every reasoner tensor bit-identical while the sound pathway moves."""

from __future__ import annotations

import torch

from tools.world_training.sound_stage import SoundStageConfig, train_sound_stage
from tools.world_training.train_sound import build_autoencoder
from worldserve.models.cosmos3_reasoner.text_pathway import reasoner_key


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_a_sound_stage_step_moves_the_sound_pathway_and_no_reasoner_tensor(tied) -> None:
    generator, reasoner = tied
    transformer = generator.pipe.transformer
    reasoner_before, transformer_before = snapshot(reasoner.model), snapshot(transformer)
    record = train_sound_stage(generator, reasoner, build_autoencoder(0),
                               SoundStageConfig(steps=1, num_eval=1), log=lambda entry: None)
    after = reasoner.model.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in reasoner_before.items())
    changed = [k for k, v in transformer.state_dict().items()
               if not torch.equal(v, transformer_before[k])]
    assert any(k.startswith("audio_proj_out") for k in changed), changed
    assert all(reasoner_key(k, reasoner.model.config.model_type) is None for k in changed)
    assert all(p.requires_grad for p in transformer.parameters())  # the freeze is undone
    assert record["history"][-1]["step"] == 1
