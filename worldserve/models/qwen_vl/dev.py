"""Tiny random-weight Qwen2.5-VL reasoner in the standard Hugging Face layout.

Written files: config.json, generation_config.json, model.safetensors, tokenizer.json,
tokenizer_config.json, chat_template.jinja, preprocessor_config.json. Loading goes through
`worldserve.models.qwen_vl.processor.load_vlm`, the same code that loads a real Qwen2.5-VL
directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from transformers import (
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
)

from worldserve.models.dev.seeding import seeded
from worldserve.models.dev.tokenizer import (
    ENDOFTEXT,
    IM_END,
    IMAGE_PAD,
    VIDEO_PAD,
    VISION_END,
    VISION_START,
    build_tokenizer,
)


@dataclass(frozen=True)
class ReasonerConfig:
    """Sizes of the dev reasoner (the real Qwen2.5-VL-3B: hidden 2048, 36 layers, head_dim 128)."""

    vocab_size: int = 512
    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4  # head_dim = 128 / 4 = 32
    num_key_value_heads: int = 2  # grouped-query attention, like the real model
    # Temporal/height/width split of the rotary half-dim: must sum to head_dim / 2 = 16.
    mrope_section: tuple[int, int, int] = (4, 6, 6)
    # Qwen2.5-VL-3B-Instruct's trained range, so that a client's `max_tokens: 4096` fits.
    max_position_embeddings: int = 128_000
    vision_depth: int = 2
    vision_hidden_size: int = 64
    vision_num_heads: int = 4
    # Layers with full attention; the others use windowed attention (window in pixels).
    vision_fullatt_block_indexes: tuple[int, ...] = (1,)
    vision_window_size: int = 56
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    # Image resize bounds: a 224x224 frame becomes 16x16 patches -> 64 image tokens.
    min_pixels: int = 56 * 56
    max_pixels: int = 224 * 224


def build_config(tokenizer: PreTrainedTokenizerFast, cfg: ReasonerConfig) -> Qwen2_5_VLConfig:
    """The Qwen2.5-VL config for `cfg`, with token ids taken from `tokenizer`."""
    ids = tokenizer.convert_tokens_to_ids
    text_config = dict(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=2 * cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_parameters={
            "rope_type": "default",
            "mrope_section": list(cfg.mrope_section),
            "rope_theta": 1e4,
        },
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    vision_config = dict(
        depth=cfg.vision_depth,
        hidden_size=cfg.vision_hidden_size,
        intermediate_size=2 * cfg.vision_hidden_size,
        num_heads=cfg.vision_num_heads,
        out_hidden_size=cfg.hidden_size,  # the merger projects into the text width
        fullatt_block_indexes=list(cfg.vision_fullatt_block_indexes),
        window_size=cfg.vision_window_size,
        patch_size=cfg.patch_size,
        temporal_patch_size=cfg.temporal_patch_size,
        spatial_merge_size=cfg.spatial_merge_size,
    )
    return Qwen2_5_VLConfig(
        text_config=text_config,
        vision_config=vision_config,
        tie_word_embeddings=True,
        image_token_id=ids(IMAGE_PAD),
        video_token_id=ids(VIDEO_PAD),
        vision_start_token_id=ids(VISION_START),
        vision_end_token_id=ids(VISION_END),
    )


def build_image_processor(cfg: ReasonerConfig) -> Qwen2VLImageProcessorPil:
    """The Pil image processor (works without torchvision; reloads with AutoImageProcessor)."""
    return Qwen2VLImageProcessorPil(
        min_pixels=cfg.min_pixels,
        max_pixels=cfg.max_pixels,
        patch_size=cfg.patch_size,
        temporal_patch_size=cfg.temporal_patch_size,
        merge_size=cfg.spatial_merge_size,
    )


def build_reasoner(target: Path, seed: int, cfg: ReasonerConfig = ReasonerConfig()) -> None:
    """Write the tiny Qwen2.5-VL checkpoint, tokenizer and image processor into `target`."""
    tokenizer = build_tokenizer(cfg.vocab_size, model_max_length=cfg.max_position_embeddings)
    with seeded(seed, "reasoner"):
        model = Qwen2_5_VLForConditionalGeneration(build_config(tokenizer, cfg)).eval()
    # Like Qwen's instruct checkpoints: stop on <|im_end|> or <|endoftext|>.
    model.generation_config.eos_token_id = [tokenizer.convert_tokens_to_ids(IM_END),
                                            tokenizer.convert_tokens_to_ids(ENDOFTEXT)]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    build_image_processor(cfg).save_pretrained(target)
