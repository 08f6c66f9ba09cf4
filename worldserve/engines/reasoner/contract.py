"""What the reasoner engine needs from a vision-language model runner (a family satisfies it
structurally; the engine never imports a family module).

The engine owns sessions, jobs, chat-template rendering and turn splicing, sampling and
retention. The runner owns the model and the per-sequence KV caches it hands out with
`new_kv()`; its `prompting` object owns the family's prompt conventions: what an image or a
video clip becomes (placeholder tokens, processor outputs), opaque `VisionInput` payloads the
engine only passes back. Only `execute.py` calls the runner's model methods.
"""

from __future__ import annotations

from typing import Any, Protocol

from worldserve.models.types import VisionInput


class SequenceKV(Protocol):
    """The cache of one sequence: `ids[i]` and `positions[:, i]` describe cached token i."""

    ids: list[int]
    next_pos: int  # the next free position (positions are never rewritten: gaps stay)

    def __len__(self) -> int: ...

    @property
    def max_position(self) -> int: ...

    def evict(self, start: int, end: int) -> None:
        """Drop cached tokens [start, end)."""

    def truncate(self, length: int) -> None:
        """Keep the first `length` tokens (rolls back rejected speculative tokens)."""

    def reset(self) -> None:
        """Drop everything (re-prefill starts from position 0)."""


class VisionPrompting(Protocol):
    """The family's prompt conventions for images and videos."""

    placeholder_ids: tuple[int, ...]  # vision placeholder tokens: never sampled

    def read_image(self, data: bytes) -> VisionInput:
        """An encoded JPEG/PNG frame -> one image input (400 / 413 for a bad frame)."""

    def read_video(self, frames: list[bytes], fps: float) -> VisionInput:
        """Encoded frames of one clip, `fps` a second -> one video input."""

    def tokenize(self, text: str, media: list[VisionInput]) -> list[int]:
        """Token ids of rendered `text`, its i-th vision placeholder (as the chat template
        renders an image or video part) expanded for `media[i]`."""


class ReasonerRunner(Protocol):
    model: Any  # the loaded model (its `config` and `generation_config` describe it)
    tokenizer: Any
    chat_template: str
    prompting: VisionPrompting
    device: Any  # where the logits stay (sampling runs there)
    vocab_size: int
    max_position_embeddings: int  # 0 when the config does not say
    num_params: int
    num_forwards: int  # forwards run so far (stats)
    # batch row of each sequence in the last batched forward (hidden-state taps read by row)
    last_batch_rows: list[int]

    def configure_decode(self, static: bool, compile_step: bool = False,
                         graphs: bool = False) -> str:
        """Pick the decode path (the family's static decode step where it has one; `graphs`:
        its steps captured and replayed); returns the path taken ("static", "static, graphs"
        or "eager")."""

    def new_kv(self) -> SequenceKV: ...

    def encode(self, media: list[VisionInput]) -> Any:
        """Vision tower output for `media` (a session keeps it per frame for re-prefill)."""

    def forward(self, kv: Any, ids: list[int], media: list[VisionInput] | None = None,
                encoded: Any = None, num_logits: int = 1) -> Any:
        """Append `ids` to `kv`; (num_logits, V) float32 logits of the last positions, on the
        runner's device."""

    def forward_decode_batch(self, kvs: list[Any], fed: list[list[int]]) -> list[Any]:
        """One decode step of several sequences in one forward; per-sequence logits."""

    def forward_prefill_batch(self, kvs: list[Any], ids: list[list[int]],
                              media: list[list[VisionInput]]) -> list[Any]:
        """One chunk per sequence in one forward; each chunk's last-position logits (V,)."""
