"""An independent scalar sampler: the reasoner's sampling as it was before batching
(`git show 599d8ea^:worldserve/engines/reasoner/decoding.py`, `ReplyDecoder.process` and
`.sample`), one row at a time with `torch.multinomial`, kept here as the reference the engine's
batched, device-side sampler (`engines/reasoner/sampling.py`) is held to. It shares no code with
the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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

    def process(self, logits: torch.Tensor) -> torch.Tensor:
        """(V,) raw logits -> penalised logits (banned tokens at -inf)."""
        logits = logits[: self.vocab_size].clone()
        logits[list(self.banned)] = float("-inf")
        if self.repetition_penalty != 1.0:
            seen = logits[self.seen]
            logits[self.seen] = torch.where(seen > 0, seen / self.repetition_penalty,
                                            seen * self.repetition_penalty)
        if self.frequency_penalty or self.presence_penalty:
            logits -= self.frequency_penalty * self.counts
            logits -= self.presence_penalty * (self.counts > 0).float()
        return logits

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """Processed logits -> temperature, top-k, top-p -> probabilities (unnormalised cut)."""
        logits = logits / self.temperature
        if self.top_k and 0 < self.top_k < logits.shape[0]:
            kth = torch.topk(logits, self.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if self.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            cumulative = torch.cumsum(sorted_probs, dim=-1)
            sorted_probs[cumulative - sorted_probs > self.top_p] = 0.0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        return probs

    def sample(self, raw: torch.Tensor) -> int:
        logits = self.process(raw)
        if self.temperature == 0:
            return int(torch.argmax(logits))
        return int(torch.multinomial(self.probabilities(logits), 1, generator=self.generator))

    def accept(self, token: int) -> None:
        self.seen[token] = True
        self.counts[token] += 1
