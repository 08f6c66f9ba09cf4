"""The step runner: the one module that calls the reasoner runner.

The engine turns scheduled jobs into typed rows (`PrefillRow`: a sequence's next prefill group;
`DecodeRow`: a decoding sequence) and hands them here; what comes back is logits to sample from
(prefill) or each row's next token (decode). Cache operations a session decided (evictions, a
reset for re-prefill, the roll-back of rejected drafts) are applied here too, so jobs, sessions
and decoders stay state and transitions.

Decode steps speculate when a proposer is configured: each row feeds its last sampled token
plus drafts, every position is sampled in order from the verified logits with the row's own
generator (exactly as without speculation), a draft is kept only when it equals that token, and
the K/V of the rest is cut. Lossless for greedy and sampled replies alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from worldserve.engines.reasoner.contract import ReasonerRunner, SequenceKV
from worldserve.engines.reasoner.decoding import Proposer, ReplyDecoder
from worldserve.engines.reasoner.sampling import sample_rows
from worldserve.engines.reasoner.session import CacheOps
from worldserve.models.types import VisionInput


@dataclass
class PrefillRow:
    """A sequence's next prefill: `ids` with the placeholders of `media`. `encoded`: their vision
    outputs when kept from before; with `keep_encoded`, a prefill run alone leaves what it
    computed there (a session keeps a frame's for re-prefill)."""

    kv: SequenceKV
    ids: list[int]
    media: list[VisionInput]
    encoded: Any = None
    keep_encoded: bool = False


@dataclass
class DecodeRow:
    """A decoding sequence: its cache, the sampled token not fed yet, its reply's decoder."""

    kv: SequenceKV
    pending: int
    decoder: ReplyDecoder


class StepRunner:
    """Runs the engine's steps on the runner (and the proposer's drafter)."""

    def __init__(self, runner: ReasonerRunner, proposer: Proposer | None) -> None:
        self.runner = runner
        self.proposer = proposer

    def configure_decode(self, static: bool, compile_step: bool, graphs: bool = False) -> str:
        """The decode path the runner takes ("static", "static, graphs" or "eager")."""
        return self.runner.configure_decode(static, compile_step, graphs)

    def new_kv(self) -> SequenceKV:
        return self.runner.new_kv()

    @staticmethod
    def apply(kv: SequenceKV, ops: CacheOps) -> None:
        """Evict token ranges (in the order given), then drop everything for a re-prefill."""
        for start, end in ops.evict:
            kv.evict(start, end)
        if ops.reset:
            kv.reset()

    def prefill(self, rows: list[PrefillRow]) -> list[torch.Tensor]:
        """Each row's chunk appended to its cache, in one forward when several; each chunk's
        last-position logits (V,), on the runner's device."""
        runner = self.runner
        if len(rows) == 1:
            row = rows[0]
            if row.keep_encoded and row.media and row.encoded is None:
                row.encoded = runner.encode(row.media)
            return [runner.forward(row.kv, row.ids, row.media, row.encoded)[-1]]
        return runner.forward_prefill_batch([r.kv for r in rows], [r.ids for r in rows],
                                            [r.media for r in rows])

    @staticmethod
    def first_tokens(decoders: list[ReplyDecoder], logits: list[torch.Tensor]) -> list[int]:
        """Each reply's first token, sampled in one call and accepted."""
        tokens = sample_rows(decoders, torch.stack(logits))
        for decoder, token in zip(decoders, tokens):
            decoder.accept(token)
        return tokens

    def decode(self, rows: list[DecodeRow]) -> list[int]:
        """One decode step of every row (with drafts when speculating) in one forward; returns
        each row's new pending token (sampled, accepted, not fed)."""
        fed = [self._feed(row) for row in rows]
        logits = self.runner.forward_decode_batch([r.kv for r in rows], fed)
        firsts = sample_rows([r.decoder for r in rows], torch.stack([lg[0] for lg in logits]))
        return [self._verify(row, tokens, lg, first)
                for row, tokens, lg, first in zip(rows, fed, logits, firsts)]

    def _feed(self, row: DecodeRow) -> list[int]:
        """The tokens to feed: the last sampled token, then any drafts."""
        proposer = self.proposer
        if proposer is None:
            return [row.pending]
        drafts = proposer.draft(row.kv, row.pending, row.decoder.remaining - 1)
        if drafts:
            proposer.num_drafted += len(drafts)
            proposer.num_steps += 1
        return [row.pending] + drafts

    def _verify(self, row: DecodeRow, fed: list[int], logits: torch.Tensor, first: int) -> int:
        """Sample position by position from the logits of `fed` (already in the cache); keep a
        draft only when it equals the sampled token; cut the K/V of the rest."""
        drafts = fed[1:]
        num_kept = len(fed)
        token = first
        for i in range(len(fed)):
            if i > 0:
                token = sample_rows([row.decoder], logits[i:i + 1])[0]
            finished = row.decoder.accept(token) is not None
            if finished or i == len(drafts) or token != drafts[i]:
                num_kept = i + 1
                break
        row.kv.truncate(len(row.kv) - (len(fed) - num_kept))
        if self.proposer is not None:
            self.proposer.num_accepted += num_kept - 1
        return token
