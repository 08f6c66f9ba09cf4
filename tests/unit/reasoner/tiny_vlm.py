"""A tiny random Qwen2.5-VL / Qwen3-VL checkpoint for reasoner tests (cpu-stack.md 5-6).

Self-contained so the reasoner tests do not depend on the dev-model builders; same layout
(config, safetensors, tokenizer, chat template, Pil image processor) as a real checkpoint.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
)

SPECIAL = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
# Qwen2.5-VL-like: inserts a default system message when none is given (spec 10, rule 1).
CHAT = (
    "{% for m in messages %}{% if loop.first and m['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _corpus():
    words = (
        "a person walks a red car turns left the camera pans frame hazard clear yes no "
        "robot arm picks up the blue cup"
    ).split()
    for i in range(200):
        yield " ".join(words[(i * 7 + j) % len(words)] for j in range(12)) + f' {i} {{"k": {i}}}'


def build_tokenizer(vocab_size: int = 384) -> PreTrainedTokenizerFast:
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL[1:],
        chat_template=CHAT,
    )


def _text_config(tok, max_positions: int, head_dim: int | None = None, interleaved=False):
    rope = {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1e4}
    if interleaved:
        rope["mrope_interleaved"] = True
    cfg = dict(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        rope_parameters=rope,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    if head_dim:
        cfg["head_dim"] = head_dim
    return cfg


def build(
    target: Path, family: str = "qwen2_5_vl", max_positions: int = 2048, seed: int = 0
) -> Path:
    """Write a tiny checkpoint into `target` (head_dim 16, 2 layers, 224 px max)."""
    tok = build_tokenizer()
    ids = tok.convert_tokens_to_ids
    token_ids = dict(
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
    )
    torch.manual_seed(seed)
    if family == "qwen3_vl":
        cfg = Qwen3VLConfig(
            text_config=_text_config(tok, max_positions, head_dim=16, interleaved=True),
            vision_config=dict(
                depth=2,
                hidden_size=64,
                intermediate_size=128,
                num_heads=4,
                out_hidden_size=64,
                patch_size=16,
                num_position_embeddings=196,
                deepstack_visual_indexes=[0],
            ),
            tie_word_embeddings=True,
            **token_ids,
        )
        model = Qwen3VLForConditionalGeneration(cfg).eval()
        ip = Qwen2VLImageProcessorPil(
            min_pixels=32 * 32,
            max_pixels=256 * 256,
            patch_size=16,
            temporal_patch_size=2,
            merge_size=2,
        )
    else:
        cfg = Qwen2_5_VLConfig(
            text_config=_text_config(tok, max_positions),
            vision_config=dict(
                depth=2,
                hidden_size=64,
                intermediate_size=128,
                num_heads=4,
                out_hidden_size=64,
                fullatt_block_indexes=[1],
                window_size=56,
            ),
            tie_word_embeddings=True,
            **token_ids,
        )
        model = Qwen2_5_VLForConditionalGeneration(cfg).eval()
        ip = Qwen2VLImageProcessorPil(
            min_pixels=28 * 28,
            max_pixels=224 * 224,
            patch_size=14,
            temporal_patch_size=2,
            merge_size=2,
        )
    model.generation_config.eos_token_id = [tok.eos_token_id, tok.pad_token_id]
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(target)
    tok.save_pretrained(target)
    ip.save_pretrained(target)
    return target


def frame_bytes(index: int, size: int = 56, fmt: str = "PNG") -> bytes:
    """A deterministic test frame (a moving gradient), encoded as PNG or JPEG."""
    rng = np.random.default_rng(index)
    y, x = np.mgrid[0:size, 0:size]
    img = np.stack(
        [(x * 4 + index * 9) % 256, (y * 4) % 256, rng.integers(0, 256, size=(size, size))], -1
    ).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format=fmt)
    return buf.getvalue()
