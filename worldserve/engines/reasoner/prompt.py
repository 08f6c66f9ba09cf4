"""Prompt construction per frame (spec streaming-reasoning.md section 10): chat-template
rendering and turn splicing.

Every turn is rendered through the checkpoint's own chat template with `{"type": "image"}` /
`{"type": "video"}` parts; what those placeholders become (token counts, processor outputs) is
the family's (`contract.VisionPrompting`). The only token ids the engine knows by name are the
end-of-turn ids, read from the template.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from worldserve.engines.reasoner.contract import VisionPrompting
from worldserve.models.types import VisionInput

_MARK = "\u2063worldserve\u2063"  # a marker no real prompt contains


@dataclass
class FrameChunk:
    """The tokens one frame adds: `closing_ids` close the previous reply (they extend its
    assistant_text segment); `turn_ids` are the new user turn plus the assistant prefix.
    `decode_ms`: reading the frame (image decode and preprocessing); `build_ms`: the turn."""

    turn_ids: list[int]
    image: VisionInput
    closing_ids: list[int] = field(default_factory=list)
    decode_ms: float = 0.0
    build_ms: float = 0.0


@dataclass
class ChatPrompt:
    input_ids: list[int]
    media: list[VisionInput]


class PromptBuilder:
    """Chat template rendering and turn splicing for one checkpoint."""

    def __init__(self, tokenizer: Any, chat_template: str, prompting: VisionPrompting) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.prompting = prompting
        self.placeholder_ids = prompting.placeholder_ids
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
        ids = self.prompting.tokenize(tail, [])
        return ids or [self.tokenizer.eos_token_id]

    # ------------------------------------------------------------------ frames and chats

    def frame_chunk(self, data: bytes, system_prompt: str | None, question: str,
                    closing_token: int | None, stop_ids: set[int]) -> FrameChunk:
        """The chunk of one frame. `system_prompt` is set for the first frame only."""
        start = time.perf_counter()
        image = self.prompting.read_image(data)
        read = time.perf_counter()
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
        turn_ids = self.prompting.tokenize(text, [image])
        done = time.perf_counter()
        return FrameChunk(turn_ids, image, closing, (read - start) * 1000, (done - read) * 1000)

    def chat_prompt(self, messages: list[dict], media: list[VisionInput]) -> ChatPrompt:
        """`messages` in chat-template form ({"type": "image"} / {"type": "video"} parts);
        `media` the inputs of those parts, in order."""
        text = self.render(messages, add_generation_prompt=True)
        return ChatPrompt(self.prompting.tokenize(text, media), media)
