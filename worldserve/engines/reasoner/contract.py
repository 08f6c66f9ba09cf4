"""What the reasoner engine needs from a vision-language model runner (a family satisfies it
structurally; the engine never imports a family module).

The engine owns sessions, jobs, prompts, sampling and retention; the runner owns the model, its
tokenizer/image processor and the per-sequence KV caches it hands out with `new_kv()`.
"""

from __future__ import annotations

from typing import Any, Protocol

from worldserve.models.types import ImageInput


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


class ReasonerRunner(Protocol):
    model: Any  # the loaded model (its `config` and `generation_config` describe it)
    tokenizer: Any
    image_processor: Any
    chat_template: str
    image_token_id: int
    vocab_size: int
    max_position_embeddings: int  # 0 when the config does not say
    num_params: int
    num_forwards: int  # forwards run so far (stats)
    # batch row of each sequence in the last batched forward (hidden-state taps read by row)
    last_batch_rows: list[int]

    def new_kv(self) -> SequenceKV: ...

    def encode_images(self, images: list[ImageInput]) -> Any:
        """Vision tower output for `images` (a session keeps it per frame for re-prefill)."""

    def forward(self, kv: Any, ids: list[int], images: list[ImageInput] | None = None,
                encoded: Any = None, num_logits: int = 1) -> Any:
        """Append `ids` to `kv`; (num_logits, V) float32 CPU logits of the last positions."""

    def forward_decode_batch(self, kvs: list[Any], fed: list[list[int]]) -> list[Any]:
        """One decode step of several sequences in one forward; per-sequence logits."""

    def forward_prefill_batch(self, kvs: list[Any], ids: list[list[int]],
                              images: list[list[ImageInput]]) -> list[Any]:
        """One chunk per sequence in one forward; each chunk's last-position logits (V,)."""
