"""Load a Qwen-VL family checkpoint: model, image processor, tokenizer and chat template.

Uses the project's loader (`worldserve.models.processor.load_vlm`) when it is present; it falls
back to the Pil image processors when torchvision is missing. The engine only needs the image
processor and the tokenizer from the processor: it expands image placeholders itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass
class LoadedVLM:
    model: Any
    image_processor: Any
    tokenizer: Any
    chat_template: str


def _read_chat_template(path: Path, tokenizer: Any) -> str:
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    as_json = path / "chat_template.json"
    if as_json.is_file():
        template = json.loads(as_json.read_text(encoding="utf-8")).get("chat_template")
        if template:
            return template
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.chat_template
    raise ValueError(f"{path} has no chat template (chat_template.jinja/json or in the tokenizer)")


def _load_fallback(path: Path, dtype: torch.dtype, device: str) -> tuple[Any, Any, Any]:
    """transformers' own classes; the Pil image processor works without torchvision."""
    import warnings

    from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

    model = AutoModelForImageTextToText.from_pretrained(
        str(path), dtype=dtype, local_files_only=True
    ).to(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        image_processor = AutoImageProcessor.from_pretrained(str(path), local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    return model.eval(), image_processor, tokenizer


def load_vlm(path: Path, dtype: torch.dtype, device: str) -> LoadedVLM:
    """The model (eval mode, on `device`) and what the engine needs to build prompts."""
    try:
        from worldserve.models.processor import load_vlm as project_load_vlm
    except ImportError:
        model, image_processor, tokenizer = _load_fallback(path, dtype, device)
    else:
        model, processor = project_load_vlm(path, dtype=dtype, device=device)
        image_processor, tokenizer = processor.image_processor, processor.tokenizer
    return LoadedVLM(model, image_processor, tokenizer, _read_chat_template(path, tokenizer))
