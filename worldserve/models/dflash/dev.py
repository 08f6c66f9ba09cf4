"""Tiny seeded DFlash drafters (random weights) matched to the dev reasoners.

A drafter fits a target when its hidden size is the target's, its `target_layer_ids` are
target layers and its `mask_token_id` is in the target's vocabulary (drafter.check_fits).
Random weights draft badly: acceptance is low, but every draft is verified, so replies are
those of the target alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModel, MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel

from worldserve.models.cosmos3_reasoner.dev import ReasonerDevConfig
from worldserve.models.dev.seeding import seeded

BLOCK_SIZE = 4  # the anchor + 3 masked positions: up to 3 drafts per step


def drafter_config(hidden_size: int, num_target_layers: int, vocab_size: int,
                   block_size: int = BLOCK_SIZE, num_layers: int = 1,
                   target_layer_ids: list[int] | None = None) -> MuseGlimmerAssistantConfig:
    """A drafter of `num_layers` layers reading `target_layer_ids` (default: the first and the
    last target layer)."""
    heads = 2
    return MuseGlimmerAssistantConfig(
        hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=heads, num_key_value_heads=1, head_dim=hidden_size // heads,
        layer_types=["full_attention"] * num_layers, max_position_embeddings=32768,
        block_size=block_size, mask_token_id=vocab_size - 1,
        target_layer_ids=sorted(target_layer_ids or {0, num_target_layers - 1}),
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )


def new_drafter(config: MuseGlimmerAssistantConfig, seed: int) -> MuseGlimmerAssistantModel:
    """The drafter's seeded initial (random) weights."""
    with seeded(seed, "dflash-drafter"):
        return MuseGlimmerAssistantModel(config)


def write_drafter(target: Path, seed: int, hidden_size: int, num_target_layers: int,
                  vocab_size: int, block_size: int = BLOCK_SIZE) -> None:
    """Write a one-layer drafter reading the first and the last target layer."""
    config = drafter_config(hidden_size, num_target_layers, vocab_size, block_size)
    new_drafter(config, seed).save_pretrained(target)


def write_drafter_for(target: Path, seed: int, reasoner_dir: Path,
                      block_size: int = BLOCK_SIZE) -> None:
    """A drafter matched to the reasoner checkpoint in `reasoner_dir` (its config.json)."""
    config = json.loads((Path(reasoner_dir) / "config.json").read_text(encoding="utf-8"))
    text = config.get("text_config") or config
    write_drafter(target, seed, text["hidden_size"], text["num_hidden_layers"],
                  text["vocab_size"], block_size)


def build_drafter(target: Path, seed: int) -> None:
    """The dev builder: a drafter for the dev Cosmos3 reasoner (`cosmos3-reasoner`, and the
    reasoner inside the Cosmos3 `generation` directory: same text sizes)."""
    cfg = ReasonerDevConfig()
    write_drafter(target, seed, cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size)


def write_constant_drafter(target: Path, seed: int, reasoner_dir: Path, model: Any,
                           token: int) -> None:
    """A hand-set drafter that always drafts `token` (for tests and for the benchmark's upper
    bound, not a DFlash-quality drafter): its blocks are zeroed, so each output is the normed
    input embedding, and its mask token is one whose embedding `model`'s lm_head maps to
    `token`. ValueError when no vocabulary entry maps there."""
    write_drafter_for(target, seed, reasoner_dir)
    drafter = AutoModel.from_pretrained(target)
    for layer in drafter.layers:
        torch.nn.init.zeros_(layer.self_attn.o_proj.weight)
        torch.nn.init.zeros_(layer.mlp.down_proj.weight)
    with torch.no_grad():
        emb = model.get_input_embeddings().weight.float()
        eps = drafter.norm.variance_epsilon
        normed = emb * torch.rsqrt(emb.pow(2).mean(-1, keepdim=True) + eps)
        head = model.get_output_embeddings()
        drafts = (normed.to(head.weight.dtype) @ head.weight.T).argmax(-1)
    hits = torch.nonzero(drafts == token)
    if not len(hits):
        raise ValueError(f"no mask token makes the drafter draft token {token}")
    drafter.config.mask_token_id = int(hits[0])
    drafter.save_pretrained(target)
