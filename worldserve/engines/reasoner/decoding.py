"""Per-reply decoding: logits processing, sampling, grammar, stop conditions, speculation.

One `ReplyDecoder` per reply. `decode_step` feeds the last sampled token (plus speculative
drafts) and samples the next token(s). Speculation is lossless: each position's token is sampled
from the verified logits in order with the same generator, exactly as without speculation; a
draft is kept only when it equals that token, and the KV of rejected drafts is rolled back.
A `Proposer` drafts: n-gram prompt lookup here, DFlash in dflash.py.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from worldserve.engines.reasoner.contract import ReasonerRunner, SequenceKV
from worldserve.engines.reasoner.guided import Guide
from worldserve.ipc.messages import ReasonerSampling


class ReplyDecoder:
    """Decides each next token of one reply and when the reply ends."""

    def __init__(self, sampling: ReasonerSampling, context_ids: list[int], stop_ids: set[int],
                 tokenizer, vocab_size: int, generator: torch.Generator,
                 guide: Guide | None = None, banned_ids: tuple[int, ...] = ()) -> None:
        self.sampling = sampling
        self.stop_ids = stop_ids
        self.tokenizer = tokenizer
        self.generator = generator
        self.guide = guide
        self.tokens: list[int] = []
        self.finish_reason: str | None = None
        self.text = ""
        # repetition penalty: context + reply
        self._seen = torch.zeros(vocab_size, dtype=torch.bool)
        if context_ids:
            self._seen[torch.tensor(sorted(set(context_ids)), dtype=torch.long)] = True
        self._counts = torch.zeros(vocab_size)  # frequency/presence: reply only
        self._stop_mask = torch.zeros(vocab_size, dtype=torch.bool)
        self._stop_mask[[t for t in stop_ids if t < vocab_size]] = True
        # Vision placeholders are never output: fed back as context they would be read as image
        # positions (mm_token_type_ids) without an image.
        self._banned = torch.tensor([t for t in banned_ids if 0 <= t < vocab_size],
                                    dtype=torch.long)

    def process(self, logits: torch.Tensor) -> torch.Tensor:
        """(V,) raw logits -> penalised and grammar-masked logits."""
        s = self.sampling
        logits = logits[: self._seen.shape[0]].clone()
        logits[self._banned] = float("-inf")
        if s.repetition_penalty != 1.0:
            seen = logits[self._seen]
            logits[self._seen] = torch.where(seen > 0, seen / s.repetition_penalty,
                                             seen * s.repetition_penalty)
        if s.frequency_penalty or s.presence_penalty:
            logits -= s.frequency_penalty * self._counts
            logits -= s.presence_penalty * (self._counts > 0).float()
        if self.guide is not None:
            allowed = self.guide.allowed()
            allowed = allowed & ~self._stop_mask
            if self.guide.is_accepting():
                allowed = allowed | self._stop_mask  # EOS only once the grammar accepts
            logits = logits.masked_fill(~allowed, float("-inf"))
        return logits

    def sample(self, logits: torch.Tensor) -> int:
        s = self.sampling
        logits = self.process(logits)
        if s.temperature == 0:
            return int(torch.argmax(logits))
        logits = logits / s.temperature
        if s.top_k and s.top_k > 0 and s.top_k < logits.shape[0]:
            kth = torch.topk(logits, s.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if s.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            cumulative = torch.cumsum(sorted_probs, dim=-1)
            drop = cumulative - sorted_probs > s.top_p  # keep the smallest set reaching top_p
            sorted_probs[drop] = 0.0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def accept(self, token: int) -> str | None:
        """Record a sampled token; returns the finish reason when the reply ends with it."""
        self.tokens.append(token)
        if token in self.stop_ids:
            self.finish_reason = "stop"
        else:
            self._seen[token] = True
            self._counts[token] += 1
            if self.guide is not None:
                self.guide.consume(token)
                if self.guide.is_complete():
                    self.finish_reason = "stop"
        self.text = self._decode()
        if self.finish_reason is None and self.sampling.stop:
            cut = min((i for i in (self.text.find(x) for x in self.sampling.stop) if i >= 0),
                      default=-1)
            if cut >= 0:
                self.text = self.text[:cut]
                self.finish_reason = "stop"
        if self.finish_reason is None and len(self.tokens) >= self.sampling.max_tokens:
            self.finish_reason = "length"
        return self.finish_reason

    def _decode(self) -> str:
        ids = [t for t in self.tokens if t not in self.stop_ids]
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    @property
    def remaining(self) -> int:
        return self.sampling.max_tokens - len(self.tokens)


class Proposer(Protocol):
    """A speculation method: drafts for one sequence; engine-wide counters for stats()."""

    num_drafted: int
    num_accepted: int
    num_steps: int  # decode steps that drafted (accepted tokens per step = accepted / steps)

    def draft(self, kv: SequenceKV, pending: int, limit: int) -> list[int]:
        """At most `limit` tokens expected to follow `pending` (not fed yet) after `kv`."""


class NgramProposer:
    """Prompt-lookup drafting: the tokens that followed the latest earlier occurrence of the
    context's last n tokens (n from `max_n` down to `min_n`)."""

    def __init__(self, num_tokens: int, max_n: int = 3, min_n: int = 1) -> None:
        self.num_tokens, self.max_n, self.min_n = num_tokens, max_n, min_n
        self.num_drafted = 0  # engine-wide counters, reported in stats()
        self.num_accepted = 0
        self.num_steps = 0

    def draft(self, kv: SequenceKV, pending: int, limit: int) -> list[int]:
        return self.propose(kv.ids + [pending], limit)

    def propose(self, context: list[int], limit: int) -> list[int]:
        k = min(self.num_tokens, limit)
        if k <= 0 or len(context) < self.min_n + 1:
            return []
        arr = np.asarray(context, dtype=np.int64)
        for n in range(min(self.max_n, len(arr) - 1), self.min_n - 1, -1):
            windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], n)
            hits = np.flatnonzero((windows == arr[-n:]).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                return arr[start:start + k].tolist()
        return []


def propose(kv: SequenceKV, decoder: ReplyDecoder, pending: int,
            proposer: Proposer | None) -> list[int]:
    """The tokens to feed this step: the last sampled token, then any drafts."""
    drafts = proposer.draft(kv, pending, decoder.remaining - 1) if proposer else []
    if proposer and drafts:
        proposer.num_drafted += len(drafts)
        proposer.num_steps += 1
    return [pending] + drafts


def verify(kv: SequenceKV, decoder: ReplyDecoder, fed: list[int], logits: torch.Tensor,
           proposer: Proposer | None = None) -> int:
    """Sample position by position from the logits of `fed` (already appended to `kv`); keep a
    draft only when it equals the sampled token; crop the K/V of the rest. Returns the new
    pending token (sampled, not fed)."""
    drafts = fed[1:]
    num_kept = len(fed)
    for i in range(len(fed)):
        token = decoder.sample(logits[i])
        finished = decoder.accept(token) is not None
        if finished or i == len(drafts) or token != drafts[i]:
            num_kept = i + 1
            break
    kv.truncate(len(kv) - (len(fed) - num_kept))
    if proposer:
        proposer.num_accepted += num_kept - 1
    return token


def decode_step(runner: ReasonerRunner, kv: SequenceKV, decoder: ReplyDecoder, pending: int,
                proposer: Proposer | None) -> int:
    """Feed `pending` (+ drafts), sample until a draft is rejected or the reply ends.
    Returns the new pending token (sampled, not fed)."""
    fed = propose(kv, decoder, pending, proposer)
    logits = runner.forward(kv, fed, num_logits=len(fed))
    return verify(kv, decoder, fed, logits, proposer)
