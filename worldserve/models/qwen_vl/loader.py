"""Load a Qwen-VL family checkpoint: model, image processor, tokenizer and chat template.

Goes through the project's loader (`worldserve.models.qwen_vl.processor.load_vlm`: the official
processor where it can be built, else the Pil image processor shim, so no torchvision). The
engine uses only the image processor and the tokenizer: it expands image placeholders itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from worldserve.models.qwen_vl.processor import load_vlm as project_load_vlm


@dataclass
class LoadedVLM:
    model: Any
    image_processor: Any
    tokenizer: Any
    chat_template: str


def load_vlm(path: Path, dtype: torch.dtype | str, device: str) -> LoadedVLM:
    """The model (eval mode, on `device`) and what the engine needs to build prompts."""
    model, processor = project_load_vlm(path, dtype=dtype, device=device)
    tokenizer = processor.tokenizer
    template = getattr(processor, "chat_template", None) or tokenizer.chat_template
    if not template:
        raise ValueError(f"{path} has no chat template (chat_template.jinja/json or in the "
                         "tokenizer config)")
    return LoadedVLM(model, processor.image_processor, tokenizer, template)
