"""Per-reply decoding state: what each reply has sampled, its penalties and grammar, when it
ends; and the speculation methods that draft for it.

One `ReplyDecoder` per reply: `accept(token)` is its only transition. The sampler
(`sampling.sample_rows`) reads its per-token state on the logits' device; the step runner
(`execute.py`) samples, verifies drafts and calls `accept`. A `Proposer` drafts: n-gram prompt
lookup here, DFlash in dflash.py.
"""

from __future__ import annotations

import functools
from typing import Protocol

import numpy as np
import torch

from worldserve.engines.reasoner.contract import SequenceKV
from worldserve.engines.reasoner.guided import Guide
from worldserve.engines.reasoner.thinking import ThinkingState
from worldserve.ipc.messages import ReasonerSampling


@functools.lru_cache(maxsize=8)
def _banned_index(ids: tuple[int, ...], device: str) -> torch.Tensor:
    """One shared index tensor per banned set (decoders of one engine batch-mask together)."""
    return torch.tensor(ids, dtype=torch.long, device=device)


class ReplyDecoder:
    """Decides each next token of one reply and when the reply ends."""

    def __init__(self, sampling: ReasonerSampling, context_ids: list[int], stop_ids: set[int],
                 tokenizer, vocab_size: int, generator: torch.Generator,
                 guide: Guide | None = None, banned_ids: tuple[int, ...] = (),
                 device: torch.device | str = "cpu",
                 thinking: ThinkingState | None = None) -> None:
        self.sampling = sampling
        self.thinking = thinking
        self.stop_ids = stop_ids
        self.tokenizer = tokenizer
        self.generator = generator
        self.guide = guide
        self.tokens: list[int] = []
        self.finish_reason: str | None = None
        self._text = ""
        self._text_tokens = 0  # len(tokens) when `_text` was decoded
        # repetition penalty: context + reply
        self.seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        if context_ids:
            self.seen[torch.tensor(sorted(set(context_ids)), dtype=torch.long,
                                   device=device)] = True
        self.counts = torch.zeros(vocab_size, device=device)  # frequency/presence: reply only
        self._stop_mask = torch.zeros(vocab_size, dtype=torch.bool)
        self._stop_mask[[t for t in stop_ids if t < vocab_size]] = True
        # Vision placeholders are never output: fed back as context they would be read as image
        # positions (mm_token_type_ids) without an image.
        self.banned = _banned_index(tuple(t for t in banned_ids if 0 <= t < vocab_size),
                                    str(device))
        # `min_tokens`: end of turn masked until the reply is that long (on the logits' device,
        # built once: an unguided row's mask then costs no copy per token)
        self._no_stop = (~self._stop_mask).to(device) if sampling.min_tokens else None
        self._stop_from_chars = 0  # a stop string counts only where it ends past this

    def allowed(self) -> torch.Tensor | None:
        """(V,) bool the grammar allows next; end of turn only once it accepts and the reply
        holds `min_tokens`. None: free. A reasoning block is free of the grammar; a spent
        thinking budget forces `</think>`."""
        thinking = self.thinking
        if thinking is not None:
            forced = thinking.forced()
            if forced is not None:
                only = torch.zeros_like(self._stop_mask)
                only[forced] = True
                return only
        short = self._short()
        if self.guide is None or (thinking is not None and thinking.inside):
            return self._no_stop if short else None
        allowed = self.guide.allowed() & ~self._stop_mask
        if self.guide.is_accepting() and not short:
            allowed = allowed | self._stop_mask  # EOS only once the grammar accepts
        return allowed

    def _short(self) -> bool:
        """The reply is below `min_tokens`: neither end of turn nor a stop string ends it."""
        return len(self.tokens) < self.sampling.min_tokens

    def accept(self, token: int) -> str | None:
        """Record a sampled token; returns the finish reason when the reply ends with it."""
        self.tokens.append(token)
        thinking = self.thinking
        reasoning = thinking is not None and (thinking.inside or thinking.forced() is not None)
        if token in self.stop_ids:
            if not self.sampling.ignore_eos:
                self.finish_reason = "stop"
        else:
            self.seen[token].fill_(True)  # not `= True`: a host number copied to the device
            self.counts[token] += 1
            if self.guide is not None and not reasoning:
                self.guide.consume(token)
                if self.guide.is_complete():
                    self.finish_reason = "stop"
        if thinking is not None:
            thinking.update(token, self.text, thinking.inside)
        if self.finish_reason is None and self.sampling.stop:
            self._check_stop_strings()
        if self.finish_reason is None and len(self.tokens) >= self.sampling.max_tokens:
            self.finish_reason = "length"
        return self.finish_reason

    def _check_stop_strings(self) -> None:
        """The first stop string in the reply ends it, but not while the reply is below
        `min_tokens`, and one that ended inside that early text never does (vLLM's rule); an
        empty stop string is none."""
        text = self.text
        if self._short():
            self._stop_from_chars = len(text)
            return
        start = self._stop_from_chars
        found = (text.find(x, max(0, start - len(x) + 1)) for x in self.sampling.stop or () if x)
        cut = min((i for i in found if i >= 0), default=-1)
        if cut >= 0:
            self._text = text[:cut]  # final: no token is accepted after the finish
            self.finish_reason = "stop"

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
