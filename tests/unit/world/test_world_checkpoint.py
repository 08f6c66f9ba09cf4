"""The dev world checkpoint (`dev-models build` -> world/) is the shipped trained weights in the
published Cosmos3 layout: the generator's transformer, VAE and sound tokenizer are the trained
tensors, the reasoner's LLM is the generator's understanding pathway (so one process can hold
one copy), and the reasoner's own tensors are the trained ones; a prompt's words are single
tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from worldserve.models.dev.world import trained


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory) -> Path:
    from worldserve.models.cosmos3.dev import build_world

    target = tmp_path_factory.mktemp("world")
    build_world(target, 0)
    return target


def shipped(prefix: str) -> dict[str, torch.Tensor]:
    with safe_open(str(trained.WEIGHTS_PATH), framework="pt") as handle:
        return {k[len(prefix):]: handle.get_tensor(k) for k in handle.keys()
                if k.startswith(prefix)}


def test_the_generator_is_the_shipped_weights(world_dir: Path) -> None:
    from worldserve.models.cosmos3.runner import load_runner

    pipe = load_runner(world_dir).pipe
    for part, module in ((trained.TRANSFORMER, pipe.transformer), (trained.VAE, pipe.vae),
                         (trained.SOUND, pipe.sound_tokenizer)):
        weights = shipped(part)
        state = module.state_dict()
        assert weights.keys() == state.keys()
        assert all(torch.equal(state[k], v) for k, v in weights.items())
    with safe_open(str(trained.WEIGHTS_PATH), framework="pt") as handle:
        assert pipe.vae.config.latents_std == json.loads(handle.metadata()["latents_std"])


def test_the_reasoner_shares_the_generators_llm_and_has_its_own_trained_tensors(
        world_dir: Path) -> None:
    from worldserve.models.cosmos3.runner import load_runner as load_generator
    from worldserve.models.cosmos3_reasoner.loader import load_runner as load_reasoner

    generator = load_generator(world_dir).pipe.transformer
    reasoner = load_reasoner(world_dir, generator=generator)  # tying checks every tensor
    assert reasoner.model.get_input_embeddings().weight is generator.embed_tokens.weight
    own = shipped(trained.REASONER)
    assert own, "the shipped weights hold no reasoner tensors"
    with safe_open(str(world_dir / trained.REASONER_WEIGHTS), framework="pt") as handle:
        assert all(torch.equal(handle.get_tensor(k), v) for k, v in own.items())


def test_prompt_words_are_single_tokens(world_dir: Path) -> None:
    from transformers import AutoTokenizer

    for folder in (world_dir / "text_tokenizer", world_dir):
        tokenizer = AutoTokenizer.from_pretrained(folder)
        ids = tokenizer("a red circle on black moving left")["input_ids"]
        assert len(ids) == 7, tokenizer.convert_ids_to_tokens(ids)
