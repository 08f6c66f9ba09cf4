"""Prompt construction per frame (spec streaming-reasoning.md section 10) and image input.

Every turn is rendered through the checkpoint's own chat template; the only token ids the
engine knows by name are the image placeholder and the end-of-turn ids, both read from the
tokenizer and the template.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from worldserve.errors import InvalidRequest, PayloadTooLarge
from worldserve.models.types import ImageInput

IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
MAX_FRAME_PIXELS = 4_194_304
_MARK = "\u2063worldserve\u2063"  # a marker no real prompt contains


@dataclass
class FrameChunk:
    """The tokens one frame adds: `closing_ids` close the previous reply (they extend its
    assistant_text segment); `turn_ids` are the new user turn plus the assistant prefix."""

    turn_ids: list[int]
    image: ImageInput
    closing_ids: list[int] = field(default_factory=list)
    decode_ms: float = 0.0
    build_ms: float = 0.0


@dataclass
class ChatPrompt:
    input_ids: list[int]
    images: list[ImageInput]


def decode_image(data: bytes) -> Image.Image:
    """JPEG/PNG bytes -> RGB image; anything else, or a corrupt file, is a 400."""
    try:
        image = Image.open(io.BytesIO(data))
        if image.format not in ("JPEG", "PNG"):
            raise InvalidRequest(f"unsupported image format {image.format!r}; send JPEG or PNG")
        if image.width * image.height > MAX_FRAME_PIXELS:
            raise PayloadTooLarge(
                f"frame too large: {image.width}x{image.height} is above {MAX_FRAME_PIXELS} pixels"
            )
        return image.convert("RGB")
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        if isinstance(exc, InvalidRequest):
            raise
        raise InvalidRequest(f"invalid image: {exc}") from None


class PromptBuilder:
    """Chat template rendering, placeholder expansion and tokenisation for one checkpoint."""

    def __init__(self, tokenizer: Any, image_processor: Any, chat_template: str) -> None:
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.chat_template = chat_template
        self.image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
        video_token_id = tokenizer.convert_tokens_to_ids(VIDEO_PAD)
        unk = getattr(tokenizer, "unk_token_id", None)
        self.placeholder_ids = tuple(t for t in (self.image_token_id, video_token_id)
                                     if isinstance(t, int) and t != unk)
        self.merge = int(getattr(image_processor, "merge_size", 2)) ** 2
        self.later_turn_text = self._later_turn_text()
        self.end_of_turn_ids = self._end_of_turn_ids()

    # ------------------------------------------------------------------ templates

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, chat_template=self.chat_template, tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )

    def _later_turn_text(self) -> str:
        """A later frame's turn, without the template's implicit default system message:
        render [system, user] and keep what follows the system message (spec 10, rule 1)."""
        system = {"role": "system", "content": _MARK}
        user = {"role": "user", "content": [{"type": "image"}]}
        both = self.render([system, user], add_generation_prompt=True)
        alone = self.render([system], add_generation_prompt=False)
        if both.startswith(alone):
            return both[len(alone):]
        return self.render([user], add_generation_prompt=True)

    def _end_of_turn_ids(self) -> list[int]:
        """What the template writes after an assistant message (`<|im_end|>\\n` for ChatML)."""
        messages = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _MARK}]
        text = self.render(messages, add_generation_prompt=False)
        tail = text[text.rfind(_MARK) + len(_MARK):] if _MARK in text else ""
        ids = self.encode(tail)
        return ids or [self.tokenizer.eos_token_id]

    # ------------------------------------------------------------------ tokens and images

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def preprocess(self, image: Image.Image) -> ImageInput:
        out = self.image_processor(images=[image], return_tensors="pt")
        grid = out["image_grid_thw"]
        return ImageInput(out["pixel_values"], grid, int(grid.prod()) // self.merge)

    def expand(self, text: str, images: list[ImageInput]) -> list[int]:
        """Tokenise `text`, expanding the i-th image placeholder to image i's token count."""
        pieces = text.split(IMAGE_PAD)
        if len(pieces) - 1 != len(images):
            raise InvalidRequest(
                f"the prompt has {len(pieces) - 1} image placeholders for {len(images)} images"
            )
        out = pieces[0]
        for image, piece in zip(images, pieces[1:]):
            out += IMAGE_PAD * image.num_tokens + piece
        return self.encode(out)

    # ------------------------------------------------------------------ frames and chats

    def frame_chunk(self, data: bytes, system_prompt: str | None, question: str,
                    closing_token: int | None, stop_ids: set[int]) -> FrameChunk:
        """The chunk of one frame. `system_prompt` is set for the first frame only."""
        start = time.perf_counter()
        image = decode_image(data)
        decoded = time.perf_counter()
        processed = self.preprocess(image)
        if system_prompt is not None:
            content: list[dict] = [{"type": "image"}]
            if question:
                content.append({"type": "text", "text": question})
            text = self.render([{"role": "system", "content": system_prompt},
                                {"role": "user", "content": content}], add_generation_prompt=True)
            closing: list[int] = []
        else:
            text = self.later_turn_text
            closing = [] if closing_token is None or closing_token in stop_ids else [closing_token]
            closing += self.end_of_turn_ids
        turn_ids = self.expand(text, [processed])
        done = time.perf_counter()
        return FrameChunk(turn_ids, processed, closing, (decoded - start) * 1000,
                          (done - decoded) * 1000)

    def chat_prompt(self, messages: list[dict], images: list[bytes]) -> ChatPrompt:
        """`messages` in chat-template form ({"type": "image"} parts); `images` in order."""
        processed = [self.preprocess(decode_image(data)) for data in images]
        text = self.render(messages, add_generation_prompt=True)
        return ChatPrompt(self.expand(text, processed), processed)
