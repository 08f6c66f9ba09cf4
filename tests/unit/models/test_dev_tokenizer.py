"""The offline dev tokenizer: deterministic, round-trips text, renders ChatML."""

from __future__ import annotations

import hashlib
from pathlib import Path

from transformers import AutoTokenizer

from worldserve.models.dev.tokenizer import SPECIAL_TOKENS, build_tokenizer


def _file_hashes(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


def test_saved_tokenizer_is_byte_identical_across_builds(tmp_path: Path) -> None:
    build_tokenizer().save_pretrained(tmp_path / "a")
    build_tokenizer().save_pretrained(tmp_path / "b")
    assert _file_hashes(tmp_path / "a") == _file_hashes(tmp_path / "b")


def test_reloaded_tokenizer_round_trips_and_knows_special_tokens(tmp_path: Path) -> None:
    build_tokenizer(model_max_length=512).save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert len(tok) == 512
    assert tok.model_max_length == 512
    special_ids = [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS]
    assert special_ids == list(range(len(SPECIAL_TOKENS)))
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.bos_token is None
    text = 'héllo ✓ 世界 {"k": 3} <|image_pad|>'
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    assert ids.count(tok.convert_tokens_to_ids("<|image_pad|>")) == 1


def test_chat_template_renders_chatml_with_image_placeholder(tmp_path: Path) -> None:
    build_tokenizer().save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hazard?"}]},
    ]
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered == (
        "<|im_start|>system\nbe brief<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>hazard?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
