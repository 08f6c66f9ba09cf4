"""Per-reply decoding: logits processing, sampling, grammar, stop conditions, speculation.

One `ReplyDecoder` per reply. `decode_step` feeds the last sampled token (plus speculative
drafts) and samples the next token(s). Speculation is lossless: each position's token is sampled
from the verified logits in order with the same generator, exactly as without speculation; a
draft is kept only when it equals that token, and the KV of rejected drafts is rolled back.
A `Proposer` drafts: n-gram prompt lookup here, DFlash in dflash.py.
"""

from __future__ import annotations

import functools
from typing import Protocol

import numpy as np
import torch

from worldserve.engines.reasoner.contract import ReasonerRunner, SequenceKV
from worldserve.engines.reasoner.guided import Guide
from worldserve.ipc.messages import ReasonerSampling


@functools.lru_cache(maxsize=8)
def _banned_index(ids: tuple[int, ...]) -> torch.Tensor:
    """One shared index tensor per banned set (decoders of one engine batch-mask together)."""
    return torch.tensor(ids, dtype=torch.long)


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
        self._text = ""
        self._text_tokens = 0  # len(tokens) when `_text` was decoded
        # repetition penalty: context + reply
        self._seen = torch.zeros(vocab_size, dtype=torch.bool)
        if context_ids:
            self._seen[torch.tensor(sorted(set(context_ids)), dtype=torch.long)] = True
        self._counts = torch.zeros(vocab_size)  # frequency/presence: reply only
        self._stop_mask = torch.zeros(vocab_size, dtype=torch.bool)
        self._stop_mask[[t for t in stop_ids if t < vocab_size]] = True
        # Vision placeholders are never output: fed back as context they would be read as image
        # positions (mm_token_type_ids) without an image.
        self._banned = _banned_index(tuple(t for t in banned_ids if 0 <= t < vocab_size))

    def sample(self, logits: torch.Tensor) -> int:
        return sample_rows([self], logits[None])[0]

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
        if self.finish_reason is None and self.sampling.stop:
            text = self.text
            cut = min((i for i in (text.find(x) for x in self.sampling.stop) if i >= 0),
                      default=-1)
            if cut >= 0:
                self._text = text[:cut]  # final: no token is accepted after the finish
                self.finish_reason = "stop"
        if self.finish_reason is None and len(self.tokens) >= self.sampling.max_tokens:
            self.finish_reason = "length"
        return self.finish_reason

    @property
    def text(self) -> str:
        """The reply so far, decoded when asked (once per accepted token at most)."""
        if self._text_tokens != len(self.tokens):
            ids = [t for t in self.tokens if t not in self.stop_ids]
            self._text = self.tokenizer.decode(ids, skip_special_tokens=True)
            self._text_tokens = len(self.tokens)
        return self._text

    @property
    def remaining(self) -> int:
        return self.sampling.max_tokens - len(self.tokens)


def process_rows(decoders: list[ReplyDecoder], logits: torch.Tensor) -> torch.Tensor:
    """(B, V) raw logits, row b for `decoders[b]` -> penalised and grammar-masked logits.

    Elementwise with per-row parameters, so a row comes out the same whether it is processed
    alone or in a batch.
    """
    first = decoders[0]
    logits = logits[:, : first._seen.shape[0]].clone()
    if all(d._banned is first._banned for d in decoders):  # one engine: one shared index
        logits[:, first._banned] = float("-inf")
    else:
        for b, d in enumerate(decoders):
            logits[b, d._banned] = float("-inf")
    samplings = [d.sampling for d in decoders]
    if any(s.repetition_penalty != 1.0 for s in samplings):
        penalty = _per_row([s.repetition_penalty for s in samplings])
        seen = torch.stack([d._seen for d in decoders])
        penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
        logits = torch.where(seen, penalised, logits)
    if any(s.frequency_penalty or s.presence_penalty for s in samplings):
        counts = torch.stack([d._counts for d in decoders])
        logits -= _per_row([s.frequency_penalty for s in samplings]) * counts
        logits -= _per_row([s.presence_penalty for s in samplings]) * (counts > 0).float()
    for b, d in enumerate(decoders):
        if d.guide is not None:
            allowed = d.guide.allowed() & ~d._stop_mask
            if d.guide.is_accepting():
                allowed = allowed | d._stop_mask  # EOS only once the grammar accepts
            logits[b] = logits[b].masked_fill(~allowed, float("-inf"))
    return logits


def sample_rows(decoders: list[ReplyDecoder], logits: torch.Tensor) -> list[int]:
    """The next token of each row of (B, V) raw logits: greedy rows by one argmax, sampled rows
    by one softmax (+ top-k / top-p where set) and a draw from each row's own generator, so a
    row gives the token it would give alone (and the token `torch.multinomial` would give)."""
    logits = process_rows(decoders, logits)
    tokens = [0] * len(decoders)
    greedy = [b for b, d in enumerate(decoders) if d.sampling.temperature == 0]
    if greedy:
        rows = logits if len(greedy) == len(decoders) else logits[greedy]
        for b, token in zip(greedy, torch.argmax(rows, dim=-1).tolist()):
            tokens[b] = token
    sampled = [b for b, d in enumerate(decoders) if d.sampling.temperature != 0]
    if sampled:
        rows = logits if len(sampled) == len(decoders) else logits[sampled]
        probs = _probabilities(rows, [decoders[b].sampling for b in sampled])
        draws = _draw(probs, [decoders[b].generator for b in sampled])
        for b, token in zip(sampled, draws):
            tokens[b] = token
    return tokens


def _draw(probs: torch.Tensor, generators: list[torch.Generator]) -> list[int]:
    """One token per row of (B, V) probabilities, row b drawn with `generators[b]`.

    What `torch.multinomial(row, 1, generator=g)` computes (exponential race: argmax of
    p / Exp(1) noise drawn from g), token for token and leaving g in the same state, but with
    one division and one argmax for the whole batch and without multinomial's input checks.
    """
    if bool(torch.isnan(probs).any()):
        raise ValueError("invalid sampling distribution: every token is masked")
    noise = torch.empty_like(probs)
    for row, generator in zip(noise, generators):
        row.exponential_(generator=generator)
    return torch.argmax(probs / noise, dim=-1).tolist()


def _probabilities(logits: torch.Tensor, samplings: list[ReasonerSampling]) -> torch.Tensor:
    """(B, V) processed logits -> temperature, top-k, top-p -> (B, V) probabilities."""
    logits = logits / _per_row([s.temperature for s in samplings])
    for b, s in enumerate(samplings):
        if s.top_k and 0 < s.top_k < logits.shape[1]:
            kth = torch.topk(logits[b], s.top_k).values[-1]
            logits[b] = logits[b].masked_fill(logits[b] < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    nucleus = [b for b, s in enumerate(samplings) if s.top_p < 1.0]
    if nucleus:
        rows = probs[nucleus]
        sorted_probs, order = torch.sort(rows, dim=-1, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        top_p = _per_row([samplings[b].top_p for b in nucleus])
        sorted_probs[cumulative - sorted_probs > top_p] = 0.0  # smallest set reaching top_p
        probs[nucleus] = torch.zeros_like(rows).scatter_(1, order, sorted_probs)
    return probs


def _per_row(values: list[float]) -> float | torch.Tensor:
    """One value per row: a Python number when the rows agree (the common case, no tensor to
    build), else a (B, 1) float32 column. Either way each element meets the same float32
    operand."""
    if all(v == values[0] for v in values):
        return values[0]
    return torch.tensor(values, dtype=torch.float32).view(-1, 1)


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
           proposer: Proposer | None = None, first: int | None = None) -> int:
    """Sample position by position from the logits of `fed` (already appended to `kv`); keep a
    draft only when it equals the sampled token; crop the K/V of the rest. Returns the new
    pending token (sampled, not fed). `first`: position 0's token, already sampled from
    `logits[0]` (a batched step samples every sequence's first position in one go)."""
    drafts = fed[1:]
    num_kept = len(fed)
    for i in range(len(fed)):
        token = first if i == 0 and first is not None else decoder.sample(logits[i])
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
