"""Load a Qwen-VL family model and its processor from a local directory.

`load_vlm` serves the dev reasoner and real Qwen2.5-VL / Qwen3-VL checkpoints alike. The official
`AutoProcessor` needs torchvision for these models (its video processor); where it cannot be
built, `VLProcessorShim` does the image part: image processor + tokenizer + `<|image_pad|>`
expansion + `mm_token_type_ids`.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoImageProcessor,
    AutoModelForImageTextToText,
    AutoProcessor,
    AutoTokenizer,
    BatchFeature,
    PreTrainedModel,
)

from worldserve.models.common import require_local_dir, resolve_dtype
from worldserve.models.qwen_vl.vision import (
    IMAGE_PAD,
    IMAGE_TOKEN_TYPE,
    VIDEO_PAD,
    VIDEO_TOKEN_TYPE,
)

logger = logging.getLogger(__name__)

# Raised by AutoProcessor for video-capable models when torchvision is missing (transformers 5.x),
# or when the directory has no processor files it recognises.
_PROCESSOR_BUILD_ERRORS = (AttributeError, ImportError, OSError, TypeError, ValueError, KeyError)


class VLProcessorShim:
    """Image processor + tokenizer + `<|image_pad|>` expansion + `mm_token_type_ids`.

    Mirrors the parts of the official Qwen-VL processors the engines use: `__call__(text=,
    images=)`, `apply_chat_template`, `decode`/`batch_decode`, `.tokenizer`, `.image_processor`.
    Videos are not supported (send frames as images).
    """

    def __init__(self, image_processor: Any, tokenizer: Any, chat_template: str | None = None):
        self.image_processor = image_processor
        self.tokenizer = tokenizer
        self.chat_template = chat_template or tokenizer.chat_template
        self.image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
        self.video_token_id = tokenizer.convert_tokens_to_ids(VIDEO_PAD)

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> VLProcessorShim:
        """Build the shim from a checkpoint directory's tokenizer and image processor files."""
        image_processor = AutoImageProcessor.from_pretrained(model_dir, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        return cls(image_processor, tokenizer, read_chat_template(Path(model_dir)))

    def save_pretrained(self, model_dir: str | Path) -> None:
        """Write the image processor and tokenizer files (the chat template goes with them)."""
        self.image_processor.save_pretrained(model_dir)
        self.tokenizer.save_pretrained(model_dir)

    def __call__(
        self,
        text: str | list[str],
        images: list[Any] | None = None,
        videos: None = None,
        return_tensors: str = "pt",
        **tokenizer_kwargs: Any,
    ) -> BatchFeature:
        """Tokenise `text`, expanding each `<|image_pad|>` to the image's token count."""
        if videos is not None:
            raise ValueError("VLProcessorShim does not process videos: send the frames as images")
        texts = [text] if isinstance(text, str) else list(text)
        out: dict[str, Any] = {}
        if images:
            pixels = self.image_processor(images=images, return_tensors="pt")
            out.update(pixels)
            texts = self._expand_image_pads(texts, pixels["image_grid_thw"])
        encoded = self.tokenizer(texts, return_tensors="pt", **tokenizer_kwargs)
        out.update(encoded)
        out["mm_token_type_ids"] = self.mm_token_type_ids(encoded["input_ids"])
        return BatchFeature(out, tensor_type=return_tensors)

    def _expand_image_pads(self, texts: list[str], image_grid_thw: torch.Tensor) -> list[str]:
        num_pads = sum(t.count(IMAGE_PAD) for t in texts)
        if num_pads != len(image_grid_thw):
            raise ValueError(
                f"got {len(image_grid_thw)} images but {num_pads} {IMAGE_PAD} placeholders in the "
                "text: put exactly one placeholder per image (the chat template does this)"
            )
        merge = self.image_processor.merge_size**2
        counts = iter((image_grid_thw.prod(-1) // merge).tolist())
        pad = re.escape(IMAGE_PAD)
        return [re.sub(pad, lambda _: IMAGE_PAD * next(counts), t) for t in texts]

    def mm_token_type_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """0 for text, 1 for image tokens, 2 for video tokens; same shape as `input_ids`."""
        is_image = (input_ids == self.image_token_id).long()
        is_video = (input_ids == self.video_token_id).long()
        return is_image * IMAGE_TOKEN_TYPE + is_video * VIDEO_TOKEN_TYPE

    def apply_chat_template(self, conversation: list[dict], **kwargs: Any) -> Any:
        """Render `conversation` with the checkpoint's chat template (tokenize=False by default)."""
        kwargs.setdefault("tokenize", False)
        return self.tokenizer.apply_chat_template(
            conversation, chat_template=self.chat_template, **kwargs
        )

    def decode(self, token_ids: Any, **kwargs: Any) -> str:
        """Decode one sequence of token ids."""
        return self.tokenizer.decode(token_ids, **kwargs)

    def batch_decode(self, sequences: Any, **kwargs: Any) -> list[str]:
        """Decode a batch of token id sequences."""
        return self.tokenizer.batch_decode(sequences, **kwargs)


def read_chat_template(model_dir: Path) -> str | None:
    """The processor-level chat template of a checkpoint, if it has one.

    Real Qwen-VL repositories keep it in `chat_template.json` (or `chat_template.jinja`), which
    `AutoTokenizer` does not always pick up.
    """
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    as_json = model_dir / "chat_template.json"
    if as_json.is_file():
        return json.loads(as_json.read_text(encoding="utf-8")).get("chat_template")
    return None


def load_processor(model_dir: str | Path) -> Any:
    """The official processor when it can be built here, otherwise `VLProcessorShim`.

    Without a `processor_config.json`, `AutoProcessor` may return a bare tokenizer (no
    `image_processor`) for model types it has no processor entry for (cosmos3_omni): that
    also falls back to the shim.
    """
    try:
        processor = AutoProcessor.from_pretrained(model_dir, local_files_only=True)
        if getattr(processor, "image_processor", None) is None:
            raise ValueError(f"AutoProcessor returned a {type(processor).__name__} without an "
                             "image processor")
        return processor
    except _PROCESSOR_BUILD_ERRORS as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        logger.info(
            "official processor unavailable for %s (%s: %s); using VLProcessorShim",
            model_dir, type(exc).__name__, reason,
        )
        return VLProcessorShim.from_pretrained(model_dir)


def load_vlm(
    model_dir: str | Path,
    dtype: torch.dtype | str = torch.float32,
    device: str | torch.device = "cpu",
) -> tuple[PreTrainedModel, Any]:
    """Load a Qwen-VL family model (eval mode, on `device`) and its processor from a local dir."""
    path = require_local_dir(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(
        path, dtype=resolve_dtype(dtype), device_map=str(device), local_files_only=True
    )
    return model.eval(), load_processor(path)
