"""Tiny random-weight Cosmos3 reasoners (Omni and Edge) in the transformers layout.

`write_reasoner_files(target)` writes config.json, generation_config.json, model.safetensors,
the tokenizer, a chat template and preprocessor_config.json into `target`. When `target` also
holds a Cosmos3 generator (`transformer/`, the diffusers layout), the reasoner takes its text
dimensions from the generator's config and its LLM weights from the generator's understanding
pathway, as in the published checkpoints (one directory, both stages). Without a generator it
builds a standalone reasoner with the same tiny dimensions.

Like a real Cosmos3-Nano directory, the Omni build has no `processor_config.json`:
`AutoProcessor` alone would return a bare tokenizer, which the loader must handle.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    Cosmos3EdgeConfig,
    Cosmos3EdgeForConditionalGeneration,
    Cosmos3EdgeImageProcessorPil,
    Cosmos3OmniConfig,
    Cosmos3OmniForConditionalGeneration,
    PreTrainedTokenizerFast,
    Qwen2VLImageProcessorPil,
)

from worldserve.models.cosmos3_reasoner.family import EDGE, OMNI
from worldserve.models.cosmos3_reasoner.text_pathway import reasoner_key
from worldserve.models.detect import diffusers_class
from worldserve.models.dev.seeding import seeded, spread_norm_weights
from worldserve.models.dev.tokenizer import (
    ENDOFTEXT,
    IM_END,
    IMAGE_PAD,
    VIDEO_PAD,
    VISION_END,
    VISION_START,
    build_tokenizer,
)

GENERATOR_TRANSFORMER = "transformer"

# `max_position_embeddings` of the real text configs: transformers' defaults for the classes
# the published Cosmos3 checkpoints use (Omni: the Qwen3-VL text config its docstring names for
# nvidia/Cosmos3-Nano; Edge: Cosmos3EdgeTextConfig). Not read from a published config.json.
REAL_CONTEXT = {OMNI: 128_000, EDGE: 131_072}

# Edge renders its own template: ChatML turns, a thinking block the generation prompt closes
# unless `enable_thinking`, and video parts the processor expands into one timestamped span
# per frame. (The published Edge template is larger: tools, reasoning history.)
EDGE_CHAT_TEMPLATE = (
    "{%- set enable_thinking = enable_thinking if enable_thinking is defined else false %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}"
    "{% if c['type'] in ('image', 'image_url') %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if not enable_thinking %}<think></think>\n{% endif %}{% endif %}"
)


@dataclass(frozen=True)
class ReasonerDevConfig:
    """Sizes of the dev reasoner. The text sizes equal the tiny Cosmos3 generator's transformer
    (model-families.md 1.7) so that both pathways can be one set of weights."""

    model_type: str = OMNI
    vocab_size: int = 512
    hidden_size: int = 32
    head_dim: int = 16
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    intermediate_size: int = 64
    num_hidden_layers: int = 2
    # Interleaved M-RoPE split of head_dim / 2 (the generator's `rope_axes_dim`).
    mrope_section: tuple[int, int, int] = (4, 2, 2)
    rope_theta: float = 5e6
    # The trained position range; None: the real architecture's (`REAL_CONTEXT`), so that a
    # client's `max_tokens: 4096` fits as it does on the published checkpoints.
    max_position_embeddings: int | None = None
    vision_depth: int = 2
    vision_hidden_size: int = 32
    vision_num_heads: int = 2
    patch_size: int = 16
    spatial_merge_size: int = 2
    # A 224x224 frame resizes to 224x224 -> 14x14 patches -> 49 image tokens.
    min_pixels: int = 64 * 64
    max_pixels: int = 224 * 224

    @property
    def temporal_patch_size(self) -> int:
        return 1 if self.model_type == EDGE else 2  # Edge: one span per frame

    @property
    def context_length(self) -> int:
        return self.max_position_embeddings or REAL_CONTEXT[self.model_type]


def write_reasoner_files(target: Path, seed: int = 0, model_type: str | None = None,
                         max_position_embeddings: int | None = None,
                         tokenizer_corpus: Iterable[str] | None = None) -> None:
    """Write a tiny seeded Cosmos3 reasoner into `target` (see module doc). `model_type`
    None: Edge beside a squared-ReLU generator, else Omni. `max_position_embeddings` None: the
    real architecture's context (tests that need a re-prefill soon pass a small one).
    `tokenizer_corpus`: the generator's (`Cosmos3DevConfig.tokenizer_corpus`), None the default."""
    target = Path(target)
    generator = _read_generator(target)
    if model_type is None:
        relu2 = bool(generator) and generator[0].get("hidden_act") == "relu2"
        model_type = EDGE if relu2 else OMNI
    cfg = _dims_from_generator(generator[0], model_type) if generator else ReasonerDevConfig(
        model_type=model_type)
    cfg = dataclasses.replace(cfg, max_position_embeddings=max_position_embeddings)
    tokenizer = build_tokenizer(cfg.vocab_size, model_max_length=cfg.context_length,
                                corpus=tokenizer_corpus)
    with seeded(seed, f"reasoner-{model_type}"):
        model = _model_class(model_type)(build_config(tokenizer, cfg)).eval()
    if generator:
        _copy_text_pathway(model, generator[1], model_type)
    _set_generation_config(model, tokenizer)
    model.save_pretrained(target)
    if model_type == EDGE:
        tokenizer.chat_template = EDGE_CHAT_TEMPLATE
    tokenizer.save_pretrained(target)
    (target / "chat_template.jinja").write_text(tokenizer.chat_template, encoding="utf-8")
    build_image_processor(cfg).save_pretrained(target)


def build_omni(target: Path, seed: int) -> None:
    """A `DevModelBuilder` entry: the standalone Omni reasoner."""
    write_reasoner_files(target, seed, OMNI)


def build_edge(target: Path, seed: int) -> None:
    """A `DevModelBuilder` entry: the standalone Edge reasoner."""
    write_reasoner_files(target, seed, EDGE)


def write_generator_transformer(target: Path, seed: int = 0, model_type: str = OMNI) -> Any:
    """A bare tiny Cosmos3 generator transformer (`model_index.json` + `transformer/`, no VAE or
    scheduler) with `ReasonerDevConfig`'s text sizes: the donor of the understanding pathway for
    tests and the memory benchmark. The full dev pipeline is the Cosmos3 generation family's."""
    from diffusers.models.transformers.transformer_cosmos3 import Cosmos3OmniTransformer

    cfg = ReasonerDevConfig(model_type=model_type)
    edge = model_type == EDGE
    with seeded(seed, f"generator-{model_type}"):
        transformer = Cosmos3OmniTransformer(
            hidden_size=cfg.hidden_size, head_dim=cfg.head_dim,
            num_attention_heads=cfg.num_attention_heads,
            num_key_value_heads=cfg.num_key_value_heads,
            intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_hidden_layers,
            vocab_size=cfg.vocab_size, rope_axes_dim=list(cfg.mrope_section),
            rope_theta=cfg.rope_theta, latent_channel=8, latent_patch_size=2,
            patch_latent_dim=32, dtype="float32", hidden_act="relu2" if edge else "silu",
            qk_norm_for_text=not edge).eval()
        spread_norm_weights(transformer)
    transformer.save_pretrained(Path(target) / GENERATOR_TRANSFORMER)
    index = {"_class_name": "Cosmos3OmniPipeline",
             GENERATOR_TRANSFORMER: ["diffusers", "Cosmos3OmniTransformer"]}
    (Path(target) / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
    return transformer


def build_config(tokenizer: PreTrainedTokenizerFast, cfg: ReasonerDevConfig) -> Any:
    """The transformers config of `cfg.model_type`, with token ids from `tokenizer`."""
    ids = tokenizer.convert_tokens_to_ids
    tokens = dict(image_token_id=ids(IMAGE_PAD), video_token_id=ids(VIDEO_PAD),
                  vision_start_token_id=ids(VISION_START), vision_end_token_id=ids(VISION_END))
    text = dict(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, head_dim=cfg.head_dim,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=cfg.context_length,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta,
                         "mrope_section": list(cfg.mrope_section), "mrope_interleaved": True},
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    if cfg.model_type == EDGE:
        text["hidden_act"] = "relu2"  # Edge's rope is not interleaved-flagged
        del text["rope_parameters"]["mrope_interleaved"]
        vision = dict(hidden_size=cfg.vision_hidden_size,
                      intermediate_size=2 * cfg.vision_hidden_size,
                      num_hidden_layers=cfg.vision_depth, num_attention_heads=cfg.vision_num_heads,
                      patch_size=cfg.patch_size, num_patches=64,
                      spatial_merge_size=cfg.spatial_merge_size)
        return Cosmos3EdgeConfig(text_config=text, vision_config=vision,
                                 projector_hidden_size=2 * cfg.hidden_size, **tokens)
    vision = dict(depth=cfg.vision_depth, hidden_size=cfg.vision_hidden_size,
                  intermediate_size=2 * cfg.vision_hidden_size, num_heads=cfg.vision_num_heads,
                  patch_size=cfg.patch_size, temporal_patch_size=cfg.temporal_patch_size,
                  spatial_merge_size=cfg.spatial_merge_size, out_hidden_size=cfg.hidden_size,
                  num_position_embeddings=64, deepstack_visual_indexes=[0, 1])
    return Cosmos3OmniConfig(text_config=text, vision_config=vision, **tokens)


def build_image_processor(cfg: ReasonerDevConfig) -> Any:
    """Omni: the Qwen2-VL image processor (patch 16, mean/std 0.5); Edge: its own (Glm4v-based)."""
    if cfg.model_type == EDGE:
        return Cosmos3EdgeImageProcessorPil(
            size={"shortest_edge": cfg.min_pixels, "longest_edge": cfg.max_pixels},
            patch_size=cfg.patch_size, temporal_patch_size=1, merge_size=cfg.spatial_merge_size)
    return Qwen2VLImageProcessorPil(
        min_pixels=cfg.min_pixels, max_pixels=cfg.max_pixels, patch_size=cfg.patch_size,
        temporal_patch_size=cfg.temporal_patch_size, merge_size=cfg.spatial_merge_size,
        image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])


def _model_class(model_type: str) -> Any:
    if model_type == EDGE:
        return Cosmos3EdgeForConditionalGeneration
    if model_type == OMNI:
        return Cosmos3OmniForConditionalGeneration
    raise ValueError(f"unknown Cosmos3 reasoner type {model_type!r}: use {OMNI} or {EDGE}")


def _set_generation_config(model: Any, tokenizer: PreTrainedTokenizerFast) -> None:
    """Stop on <|im_end|> or <|endoftext|>, as the instruct checkpoints do."""
    ids = tokenizer.convert_tokens_to_ids
    model.generation_config.eos_token_id = [ids(IM_END), ids(ENDOFTEXT)]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None


def _read_generator(target: Path) -> tuple[dict, dict[str, torch.Tensor]] | None:
    """The generator transformer's config and weights when `target` holds a generator."""
    if not (diffusers_class(target) or "").startswith("Cosmos3"):
        return None
    folder = target / GENERATOR_TRANSFORMER
    config = folder / "config.json"
    if not config.is_file():
        return None
    from safetensors.torch import load_file

    weights: dict[str, torch.Tensor] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        weights.update(load_file(shard))
    return json.loads(config.read_text(encoding="utf-8")), weights


def _dims_from_generator(config: dict, model_type: str) -> ReasonerDevConfig:
    defaults = ReasonerDevConfig(model_type=model_type)
    section = tuple(config.get("rope_axes_dim") or defaults.mrope_section)
    return ReasonerDevConfig(
        model_type=model_type,
        vocab_size=int(config.get("vocab_size", defaults.vocab_size)),
        hidden_size=int(config["hidden_size"]), head_dim=int(config["head_dim"]),
        num_attention_heads=int(config["num_attention_heads"]),
        num_key_value_heads=int(config["num_key_value_heads"]),
        intermediate_size=int(config["intermediate_size"]),
        num_hidden_layers=int(config["num_hidden_layers"]),
        mrope_section=section,  # type: ignore[arg-type]
        rope_theta=float(config.get("rope_theta", defaults.rope_theta)),
    )


@torch.no_grad()
def _copy_text_pathway(model: Any, weights: dict[str, torch.Tensor], model_type: str) -> None:
    """Overwrite the reasoner's LLM with the generator's understanding-pathway tensors."""
    params = dict(model.named_parameters())
    copied = 0
    for name, tensor in weights.items():
        target = reasoner_key(name, model_type)
        if target in params:
            params[target].copy_(tensor)
            copied += 1
    if copied == 0:
        raise ValueError("the generator transformer has no understanding-pathway weights")
