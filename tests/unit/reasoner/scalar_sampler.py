"""An independent scalar sampler: the reasoner's sampling as it was before batching
(`git show 599d8ea^:worldserve/engines/reasoner/decoding.py`, `ReplyDecoder.process` and
`.sample`), one row at a time with `torch.multinomial`, kept here as the reference the engine's
batched, device-side sampler (`engines/reasoner/sampling.py`) is held to. It shares no code with
the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class ScalarRow:
    """One reply's sampling settings and state, as the pre-batching decoder kept them."""

    vocab_size: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    banned: tuple[int, ...] = ()
    context: list[int] = field(default_factory=list)
    seed: int = 0

    def __post_init__(self) -> None:
        self.seen = torch.zeros(self.vocab_size, dtype=torch.bool)
        if self.context:
            self.seen[torch.tensor(sorted(set(self.context)))] = True
        self.counts = torch.zeros(self.vocab_size)
        self.generator = torch.Generator().manual_seed(self.seed)

    def sample(self, raw: torch.Tensor) -> int:
        return scalar_sample(raw, self, self.seen, self.counts, self.banned, None,
                             self.generator)

    def accept(self, token: int) -> None:
        self.seen[token] = True
        self.counts[token] += 1


def process(raw: torch.Tensor, knobs: Any, seen: torch.Tensor, counts: torch.Tensor,
            banned: Any, allowed: torch.Tensor | None) -> torch.Tensor:
    """(V',) raw logits -> penalised, masked logits (V,), one row."""
    logits = raw[: seen.shape[0]].clone()
    logits[list(banned)] = float("-inf")
    if knobs.repetition_penalty != 1.0:
        picked = logits[seen]
        logits[seen] = torch.where(picked > 0, picked / knobs.repetition_penalty,
                                   picked * knobs.repetition_penalty)
    if knobs.frequency_penalty or knobs.presence_penalty:
        logits -= knobs.frequency_penalty * counts
        logits -= knobs.presence_penalty * (counts > 0).float()
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    return logits


def probabilities(logits: torch.Tensor, knobs: Any) -> torch.Tensor:
    """Processed logits -> temperature, top-k, top-p -> probabilities (unnormalised cut)."""
    logits = logits / knobs.temperature
    if knobs.top_k and 0 < knobs.top_k < logits.shape[0]:
        kth = torch.topk(logits, knobs.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if knobs.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        sorted_probs[cumulative - sorted_probs > knobs.top_p] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return probs


def scalar_sample(raw: torch.Tensor, knobs: Any, seen: torch.Tensor, counts: torch.Tensor,
                  banned: Any, allowed: torch.Tensor | None, generator: torch.Generator) -> int:
    """One row's next token: argmax at temperature 0, else `torch.multinomial`."""
    logits = process(raw, knobs, seen, counts, banned, allowed)
    if knobs.temperature == 0:
        return int(torch.argmax(logits))
    return int(torch.multinomial(probabilities(logits, knobs), 1, generator=generator))


def reference_rows(decoders: list[Any], logits: torch.Tensor) -> list[int]:
    """The engine's `sample_rows` signature over the engine's decoders, sampled by the scalar
    reference from each decoder's state, one row at a time on the host."""
    return [scalar_sample(row.cpu(), d.sampling, d.seen.cpu(), d.counts.cpu(),
                          d.banned.tolist(), d.allowed(), d.generator)
            for d, row in zip(decoders, logits)]
