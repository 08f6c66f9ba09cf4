"""Choosing each row's next token on the logits' own device.

`sample_rows` takes (B, V) logits where the forward left them (the model's device) and returns
one token per row; only those B integers cross to the host, in one read (nothing else is read
back, so nothing else waits for the device: tests/unit/reasoner/test_decode_host_syncs.py).
Penalties and grammar masks are elementwise with per-row parameters, so a row gives the token
it would give alone. Greedy rows take one argmax; sampled rows one softmax and a draw with each
row's own generator: the exponential race `argmax(p / Exp(1))` that `torch.multinomial`
computes, noise drawn over the whole vocabulary so each generator advances exactly as
multinomial's would (the same tokens as before this module existed, tested against an
independent scalar sampler).

Under `top_p` the nucleus comes from the largest `NUCLEUS_PRECUT` probabilities (a `topk`)
whenever they already hold more than `top_p`: the kept set is then exactly the one a full sort
gives. Whether a row's nucleus reaches past them is read with the tokens; only such rows are
then sorted in full and redrawn with the noise already drawn (a second read: flat distributions
only, e.g. a high temperature or an untrained model). A row with every token masked raises
after the read.
"""

from __future__ import annotations

import functools
from typing import Protocol

import torch

from worldserve.ipc.messages import ReasonerSampling

NUCLEUS_PRECUT = 64  # candidates a top_p row is cut to before its cumulative sum


class SamplingRow(Protocol):
    """What the sampler reads of one reply (decoding.ReplyDecoder): its settings, generator,
    and per-token state on the logits' device."""

    sampling: ReasonerSampling
    generator: torch.Generator
    seen: torch.Tensor  # (V,) bool: context + reply tokens (repetition penalty)
    counts: torch.Tensor  # (V,) float32: reply token counts (frequency / presence)
    banned: torch.Tensor  # (k,) long: never sampled (vision placeholders)
    stop_mask: torch.Tensor  # (V,) bool

    def allowed(self) -> torch.Tensor | None:
        """(V,) bool the grammar allows next (end of turn decided here), None when unguided."""


def sample_rows(rows: list[SamplingRow], logits: torch.Tensor) -> list[int]:
    """The next token of each row of (B, V') raw logits (V' >= the rows' vocabulary). The
    tokens cross to the host in one read, the sampled rows' checks with them."""
    logits = process_rows(rows, logits)
    tokens = torch.empty(len(rows), dtype=torch.long, device=logits.device)
    greedy = [b for b, r in enumerate(rows) if r.sampling.temperature == 0]
    if greedy:
        tokens = _put(tokens, greedy, torch.argmax(_take(logits, greedy), dim=-1))
    sampled = [b for b, r in enumerate(rows) if r.sampling.temperature != 0]
    if not sampled:
        return tokens.tolist()
    drawn = Draw(_take(logits, sampled), [rows[b].sampling for b in sampled],
                 [rows[b].generator for b in sampled])
    tokens = _put(tokens, sampled, drawn.tokens)
    read = torch.cat([tokens, drawn.flags]).tolist()
    return drawn.settle(read[: len(rows)], read[len(rows):], sampled)


def process_rows(rows: list[SamplingRow], logits: torch.Tensor) -> torch.Tensor:
    """(B, V') raw logits -> (B, V) penalised and grammar-masked logits."""
    first = rows[0]
    logits = logits[:, : first.seen.shape[0]]
    logits = logits.clone() if logits.dtype == torch.float32 else logits.float()
    if all(r.banned is first.banned for r in rows):  # one engine: one shared index
        logits.index_fill_(1, first.banned, float("-inf"))
    else:
        for b, r in enumerate(rows):
            logits[b].index_fill_(0, r.banned, float("-inf"))
    samplings = [r.sampling for r in rows]
    if any(s.repetition_penalty != 1.0 for s in samplings):
        penalty = _per_row([s.repetition_penalty for s in samplings], logits)
        seen = first.seen[None] if len(rows) == 1 else torch.stack([r.seen for r in rows])
        penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
        logits = torch.where(seen, penalised, logits)
    if any(s.frequency_penalty or s.presence_penalty for s in samplings):
        counts = first.counts[None] if len(rows) == 1 else torch.stack([r.counts for r in rows])
        logits -= _per_row([s.frequency_penalty for s in samplings], logits) * counts
        logits -= _per_row([s.presence_penalty for s in samplings], logits) * (counts > 0).float()
    for b, r in enumerate(rows):
        allowed = r.allowed()
        if allowed is not None:  # the grammar runs on the host: its mask is copied over
            logits[b] = logits[b].masked_fill(~allowed.to(logits.device), float("-inf"))
    return logits


def probabilities(logits: torch.Tensor, samplings: list[ReasonerSampling]) -> torch.Tensor:
    """(B, V) processed logits -> temperature, top-k -> (B, V) probabilities (the nucleus is
    cut by `Draw`; not renormalised after the top-k cut: the draw does not need it)."""
    logits = logits / _per_row([s.temperature for s in samplings], logits)
    for b, s in enumerate(samplings):
        if s.top_k and 0 < s.top_k < logits.shape[1]:
            kth = torch.topk(logits[b], s.top_k).values[-1]
            logits[b] = logits[b].masked_fill(logits[b] < kth, float("-inf"))
    return torch.softmax(logits, dim=-1)


PAST_PRECUT, INVALID = 1, 2  # a sampled row's flag (0: its token stands)


class Draw:
    """The sampled rows' tokens, drawn without reading anything back: each row's nucleus
    (`top_p`) is cut from its NUCLEUS_PRECUT largest probabilities, and `flags` says per row
    whether the nucleus reached past them (PAST_PRECUT: the token must be redrawn from a full
    sort) or every token was masked (INVALID). The caller reads the flags with the tokens;
    `settle` redraws flagged rows with the same noise, so each token is the one a full sort
    gives and each generator advances once per row and token."""

    def __init__(self, logits: torch.Tensor, samplings: list[ReasonerSampling],
                 generators: list[torch.Generator]) -> None:
        probs = probabilities(logits, samplings)
        self.nucleus = [b for b, s in enumerate(samplings) if s.top_p < 1.0]
        past = torch.zeros(len(samplings), dtype=torch.long, device=probs.device)
        if self.nucleus:
            self.top_p = _per_row([samplings[b].top_p for b in self.nucleus], probs)
            self.nucleus_probs = _take(probs, self.nucleus)  # a copy unless every row
            cut, past_cut = _nucleus(self.nucleus_probs, self.top_p)
            probs, past = _put(probs, self.nucleus, cut), _put(past, self.nucleus, past_cut)
        self.noise = exponential_noise(probs, generators)
        self.tokens = race(probs, self.noise)
        self.flags = past + INVALID * torch.isnan(probs).any(dim=-1).long()

    def settle(self, tokens: list[int], flags: list[int], sampled: list[int]) -> list[int]:
        """`tokens` (every row's, read) with the flagged sampled rows redrawn: `sampled[i]` is
        the batch row of sampled row i, `flags[i]` its flag as read."""
        if any(f >= INVALID for f in flags):
            raise ValueError("invalid sampling distribution: every token is masked")
        past = [i for i, f in enumerate(flags) if f == PAST_PRECUT]
        if past:  # a second read (flat distributions only)
            for i, token in zip(past, self._redraw(past)):
                tokens[sampled[i]] = token
        return tokens

    def _redraw(self, past: list[int]) -> list[int]:
        """Sampled rows `past` (each a nucleus row) from the full sort, with the same noise."""
        where = [self.nucleus.index(i) for i in past]
        probs = _take(self.nucleus_probs, where)
        values, order = torch.sort(probs, dim=-1, descending=True)
        top_p = self.top_p if isinstance(self.top_p, float) else _take(self.top_p, where)
        return race(_keep(probs, values, order, top_p), _take(self.noise, past)).tolist()


def _nucleus(probs: torch.Tensor, top_p: float | torch.Tensor) -> tuple[torch.Tensor,
                                                                        torch.Tensor]:
    """Every probability outside each row's nucleus zeroed: the smallest set of the largest
    probabilities whose sum reaches `top_p` (in sorted order, as a full sort keeps it), cut
    from the row's NUCLEUS_PRECUT largest; and (B,) 1 where the nucleus reaches past those
    (that row's cut is short: `Draw` redraws it), else 0."""
    k = min(NUCLEUS_PRECUT, probs.shape[1])
    values, order = torch.topk(probs, k, dim=-1)
    inside = (torch.cumsum(values, dim=-1)[:, -1:] > top_p).view(-1)
    return _keep(probs, values, order, top_p), (~inside).long()


def _keep(probs: torch.Tensor, values: torch.Tensor, order: torch.Tensor,
          top_p: float | torch.Tensor) -> torch.Tensor:
    """`values` (the largest probabilities of each row, in `order`) kept while the sum before
    them is at most `top_p`, scattered back over zeros."""
    cumulative = torch.cumsum(values, dim=-1)
    values = values.masked_fill(cumulative - values > top_p, 0.0)
    return torch.zeros_like(probs).scatter_(1, order, values)


def exponential_noise(like: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """Exp(1) noise shaped like (B, V) `like`, row b drawn from `generators[b]` over the
    whole vocabulary (each generator advances as `torch.multinomial`'s would)."""
    noise = torch.empty_like(like)
    for row, generator in zip(noise, generators):
        row.exponential_(generator=generator)
    return noise


def race(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """One token per row of (B, V) probabilities: what `torch.multinomial(row, 1,
    generator=g)` computes (the exponential race, argmax of p / Exp(1) noise drawn from g),
    token for token, with one division and one argmax for the whole batch and without
    multinomial's input checks."""
    return torch.argmax(probs / noise, dim=-1)


def _per_row(values: list[float], like: torch.Tensor) -> float | torch.Tensor:
    """One value per row: a Python number when the rows agree (the common case, no tensor to
    build), else a (B, 1) float32 column on `like`'s device, made once per distinct list.
    Either way each element meets the same float32 operand."""
    if all(v == values[0] for v in values):
        return values[0]
    return _column(tuple(values), str(like.device))


def _take(t: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """Rows `rows` (increasing) of t: t itself when they are all of them."""
    return t if len(rows) == t.shape[0] else t.index_select(0, _index(tuple(rows), str(t.device)))


def _put(target: torch.Tensor, rows: list[int], values: torch.Tensor) -> torch.Tensor:
    """`values` written into rows `rows` (increasing) of target: values itself when they are
    all of them."""
    if len(rows) == target.shape[0]:
        return values
    return target.index_copy_(0, _index(tuple(rows), str(target.device)), values)


# A batch keeps its rows for many steps: its index and per-row columns are made (copied to
# the device) once, not per token. Cached tensors are only ever read.
@functools.lru_cache(maxsize=64)
def _index(rows: tuple[int, ...], device: str) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long, device=device)


@functools.lru_cache(maxsize=64)
def _column(values: tuple[float, ...], device: str) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, device=device).view(-1, 1)
