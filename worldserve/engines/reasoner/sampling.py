"""Choosing each row's next token on the logits' own device.

`sample_rows` takes (B, V) logits where the forward left them (the model's device) and returns
one token per row; only those B integers cross to the host. Penalties and grammar masks are
elementwise with per-row parameters, so a row gives the token it would give alone. Greedy rows
take one argmax; sampled rows one softmax and a draw with each row's own generator: the
exponential race `argmax(p / Exp(1))` that `torch.multinomial` computes, noise drawn over the
whole vocabulary so each generator advances exactly as multinomial's would (the same tokens as
before this module existed, tested against an independent scalar sampler).

Under `top_p` the nucleus comes from the largest `NUCLEUS_PRECUT` probabilities (a `topk`)
whenever they already hold more than `top_p`: the kept set is then exactly the one a full sort
gives. Only rows whose nucleus reaches past them are sorted in full, still on the device.
"""

from __future__ import annotations

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
    """The next token of each row of (B, V') raw logits (V' >= the rows' vocabulary)."""
    logits = process_rows(rows, logits)
    tokens = torch.empty(len(rows), dtype=torch.long, device=logits.device)
    greedy = [b for b, r in enumerate(rows) if r.sampling.temperature == 0]
    if greedy:
        every = len(greedy) == len(rows)
        picked = torch.argmax(logits if every else logits[greedy], dim=-1)
        tokens = picked if every else tokens.index_copy_(0, _index(greedy, logits), picked)
    sampled = [b for b, r in enumerate(rows) if r.sampling.temperature != 0]
    if sampled:
        every = len(sampled) == len(rows)
        probs = probabilities(logits if every else logits[sampled],
                              [rows[b].sampling for b in sampled])
        drawn = draw(probs, [rows[b].generator for b in sampled])
        tokens = drawn if every else tokens.index_copy_(0, _index(sampled, logits), drawn)
    return tokens.tolist()


def process_rows(rows: list[SamplingRow], logits: torch.Tensor) -> torch.Tensor:
    """(B, V') raw logits -> (B, V) penalised and grammar-masked logits."""
    first = rows[0]
    logits = logits[:, : first.seen.shape[0]]
    logits = logits.clone() if logits.dtype == torch.float32 else logits.float()
    if all(r.banned is first.banned for r in rows):  # one engine: one shared index
        logits[:, first.banned] = float("-inf")
    else:
        for b, r in enumerate(rows):
            logits[b, r.banned] = float("-inf")
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
        if allowed is not None:
            logits[b] = logits[b].masked_fill(~allowed.to(logits.device), float("-inf"))
    return logits


def probabilities(logits: torch.Tensor, samplings: list[ReasonerSampling]) -> torch.Tensor:
    """(B, V) processed logits -> temperature, top-k, top-p -> (B, V) probabilities (not
    renormalised after top-k / top-p cuts: the draw does not need it)."""
    logits = logits / _per_row([s.temperature for s in samplings], logits)
    for b, s in enumerate(samplings):
        if s.top_k and 0 < s.top_k < logits.shape[1]:
            kth = torch.topk(logits[b], s.top_k).values[-1]
            logits[b] = logits[b].masked_fill(logits[b] < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    nucleus = [b for b, s in enumerate(samplings) if s.top_p < 1.0]
    if nucleus:
        top_p = _per_row([samplings[b].top_p for b in nucleus], probs)
        rows = probs if len(nucleus) == len(samplings) else probs[nucleus]
        kept = _nucleus(rows, top_p)
        if len(nucleus) == len(samplings):
            return kept
        probs[nucleus] = kept
    return probs


def _nucleus(probs: torch.Tensor, top_p: float | torch.Tensor) -> torch.Tensor:
    """Zero every probability outside each row's nucleus: the smallest set of the largest
    probabilities whose sum reaches `top_p` (in sorted order, as a full sort keeps it). Rows
    whose nucleus lies inside their NUCLEUS_PRECUT largest probabilities take it from there;
    only the others are sorted in full."""
    k = min(NUCLEUS_PRECUT, probs.shape[1])
    values, order = torch.topk(probs, k, dim=-1)
    kept = _keep(probs, values, order, top_p)
    inside = (torch.cumsum(values, dim=-1)[:, -1:] > top_p).view(-1)
    if bool(inside.all()):
        return kept
    rest = torch.nonzero(~inside).view(-1)
    rows = probs[rest]
    values, order = torch.sort(rows, dim=-1, descending=True)
    rest_p = top_p if isinstance(top_p, float) else top_p[rest]
    kept[rest] = _keep(rows, values, order, rest_p)
    return kept


def _keep(probs: torch.Tensor, values: torch.Tensor, order: torch.Tensor,
          top_p: float | torch.Tensor) -> torch.Tensor:
    """`values` (the largest probabilities of each row, in `order`) kept while the sum before
    them is at most `top_p`, scattered back over zeros."""
    cumulative = torch.cumsum(values, dim=-1)
    values = values.masked_fill(cumulative - values > top_p, 0.0)
    return torch.zeros_like(probs).scatter_(1, order, values)


def draw(probs: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
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
    return torch.argmax(probs / noise, dim=-1)


def _per_row(values: list[float], like: torch.Tensor) -> float | torch.Tensor:
    """One value per row: a Python number when the rows agree (the common case, no tensor to
    build), else a (B, 1) float32 column on `like`'s device. Either way each element meets the
    same float32 operand."""
    if all(v == values[0] for v in values):
        return values[0]
    return torch.tensor(values, dtype=torch.float32, device=like.device).view(-1, 1)


def _index(rows: list[int], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long, device=like.device)
