"""DFlash speculation: a block-diffusion drafter reading the target's hidden states.

`attach(runner, config)` wraps the reasoner runner so that every sequence cache it hands out
(`DFlashKV`) carries a drafter cache beside the target's, token for token: each target forward
(prefill, re-prefill, decode, batched decode) records the tapped hidden states of the tokens it
appended, and every eviction, truncation (rejected drafts) and reset of the target cache is
applied to the drafter cache with the same indices. `DFlashProposer` then drafts from that
cache; verification is the engine's (execute.StepRunner), the same as for n-gram drafts.
"""

from __future__ import annotations

from typing import Any

import torch

from worldserve.config import ReasonerStageConfig
from worldserve.engines.reasoner.contract import ReasonerRunner, SequenceKV
from worldserve.models import registry


class DFlashKV:
    """A target sequence cache (`inner`) with its drafter cache (`drafter`) in lockstep."""

    def __init__(self, inner: SequenceKV, drafter: Any) -> None:
        self.inner = inner
        self.drafter = drafter

    @property
    def ids(self) -> list[int]:
        return self.inner.ids

    @property
    def next_pos(self) -> int:
        return self.inner.next_pos

    def __len__(self) -> int:
        return len(self.inner)

    @property
    def max_position(self) -> int:
        return self.inner.max_position

    def evict(self, start: int, end: int) -> None:
        self.inner.evict(start, end)
        self.drafter.evict(start, end)

    def truncate(self, length: int) -> None:
        self.inner.truncate(length)
        self.drafter.truncate(length)

    def reset(self) -> None:
        self.inner.reset()
        self.drafter.reset()

    def appended(self, hidden: dict[int, torch.Tensor], num_tokens: int) -> None:
        """The target just appended `num_tokens`; `hidden` holds their tapped hidden states."""
        self.drafter.extend(hidden, _last_positions(self.inner, num_tokens))


def _last_positions(kv: Any, num_tokens: int) -> torch.Tensor:
    """1-D positions of the last `num_tokens` cached tokens: the temporal axis of M-RoPE
    positions (equal to the text position for text tokens)."""
    positions = getattr(kv, "positions", None)
    if positions is not None:
        return positions[0, len(kv) - num_tokens:len(kv)]
    return torch.arange(kv.next_pos - num_tokens, kv.next_pos)


class DFlashRunner:
    """The reasoner runner with a DFlash drafter attached (everything else is the inner
    runner's: model, tokenizer, counters...)."""

    def __init__(self, inner: ReasonerRunner, drafter: Any) -> None:
        self.inner = inner
        self.drafter = drafter

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def new_kv(self) -> DFlashKV:
        return DFlashKV(self.inner.new_kv(), self.drafter.new_state())

    def forward(self, kv: DFlashKV, ids: list[int], media: Any = None, encoded: Any = None,
                num_logits: int = 1) -> Any:
        with self.drafter.tap.capture() as seen:
            logits = self.inner.forward(kv.inner, ids, media, encoded, num_logits)
        kv.appended({i: h[:, -len(ids):] for i, h in seen.items()}, len(ids))
        return logits

    def forward_decode_batch(self, kvs: list[DFlashKV], fed: list[list[int]]) -> list[Any]:
        with self.drafter.tap.capture() as seen:
            logits = self.inner.forward_decode_batch([kv.inner for kv in kvs], fed)
        # the forward's rows follow the runner's packed batch, not the order of `kvs`
        for b, kv, tokens in zip(self.inner.last_batch_rows, kvs, fed):
            kv.appended({i: h[b:b + 1, :len(tokens)] for i, h in seen.items()}, len(tokens))
        return logits

    def forward_prefill_batch(self, kvs: list[DFlashKV], ids: list[list[int]],
                              media: list[list[Any]]) -> list[Any]:
        """One forward per chunk: the drafter records each chunk's hidden states."""
        return [self.forward(kv, chunk, items)[-1] for kv, chunk, items in zip(kvs, ids, media)]


class DFlashProposer:
    """Drafts up to `num_tokens` (and at most block_size - 1) tokens per step from a
    sequence's drafter cache."""

    def __init__(self, num_tokens: int, block_size: int) -> None:
        self.num_tokens = min(num_tokens, block_size - 1)
        self.num_drafted = 0  # engine-wide counters, reported in stats()
        self.num_accepted = 0
        self.num_steps = 0

    def draft(self, kv: DFlashKV, pending: int, limit: int) -> list[int]:
        return kv.drafter.draft(pending, min(self.num_tokens, limit))


def attach(runner: ReasonerRunner, stage: ReasonerStageConfig) -> tuple[DFlashRunner,
                                                                         DFlashProposer]:
    """Load `streaming.spec_model_path` onto `runner`'s model (ModelLoadError when it is no
    DFlash drafter or does not fit the model)."""
    path = stage.streaming.spec_model_path
    assert path is not None  # the config refuses dflash without it
    drafter = registry.load_drafter(path, runner.model, dtype=stage.dtype, device=stage.device)
    proposer = DFlashProposer(stage.streaming.spec_num_tokens, drafter.block_size)
    return DFlashRunner(runner, drafter), proposer
