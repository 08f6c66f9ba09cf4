"""Guided decoding with llguidance: grammar compile at creation, a fresh matcher per reply.

The bitmask is unpacked with plain torch: llguidance's own torch helper is wrapped in
`torch.compile`, which costs seconds per graph on CPU (cpu-stack.md 12.1). Its module is not
even imported: the decorator alone costs about 1 CPU-s at every start of the reasoner stage,
so the mask is filled through llguidance's numpy helpers into an array torch shares.
"""

from __future__ import annotations

import json
import re
from typing import Any

import llguidance
import llguidance.hf
import llguidance.numpy
import torch

from worldserve.errors import InvalidRequest
from worldserve.ipc.messages import ReasonerSampling

_SHIFTS = torch.arange(32, dtype=torch.int32)


def grammar_for(sampling: ReasonerSampling) -> str | None:
    """The llguidance grammar of `sampling`'s guided field (at most one), else None."""
    fields = [name for name in ("guided_json", "guided_choice", "guided_regex")
              if getattr(sampling, name) is not None]
    if len(fields) > 1:
        raise InvalidRequest("at most one of guided_json, guided_choice, guided_regex may be set")
    try:
        if sampling.guided_json is not None:
            try:
                schema = json.loads(sampling.guided_json)
            except ValueError as exc:
                raise InvalidRequest(f"guided_json is not valid JSON: {exc}") from None
            return llguidance.LLMatcher.grammar_from_json_schema(
                schema, defaults={"whitespace_flexible": False})
        if sampling.guided_choice is not None:
            if not sampling.guided_choice or not all(sampling.guided_choice):
                raise InvalidRequest("guided_choice must be a non-empty list of non-empty strings")
            return llguidance.LLMatcher.grammar_from_regex(
                "|".join(re.escape(c) for c in sampling.guided_choice))
        if sampling.guided_regex is not None:
            return llguidance.LLMatcher.grammar_from_regex(sampling.guided_regex)
    except (ValueError, RuntimeError, TypeError) as exc:
        if isinstance(exc, InvalidRequest):
            raise
        raise InvalidRequest(f"{fields[0]} cannot be compiled: {exc}") from None
    return None


class GrammarFactory:
    """One llguidance tokenizer per engine; `matcher(grammar)` per reply."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.lltok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)

    def compile(self, sampling: ReasonerSampling) -> str | None:
        """Validate at creation: an invalid schema or regex is a 400 with llguidance's message."""
        grammar = grammar_for(sampling)
        if grammar is not None:
            matcher = llguidance.LLMatcher(self.lltok, grammar)
            if matcher.is_error():
                field = next(name for name in ("guided_json", "guided_choice", "guided_regex")
                             if getattr(sampling, name) is not None)
                raise InvalidRequest(f"{field} cannot be compiled: {matcher.get_error()}")
        return grammar

    def matcher(self, grammar: str) -> Guide:
        matcher = llguidance.LLMatcher(self.lltok, grammar)
        if matcher.is_error():
            raise InvalidRequest(f"guided decoding grammar is invalid: {matcher.get_error()}")
        return Guide(matcher, self.vocab_size)


class Guide:
    """A matcher for one reply: allowed-token masks and token consumption."""

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        self._words = llguidance.numpy.allocate_token_bitmask(1, vocab_size)  # (1, ⌈V/32⌉)
        self._bitmask = torch.from_numpy(self._words)  # the same memory

    def allowed(self) -> torch.Tensor:
        """(V,) bool: tokens the grammar allows next (EOS handled by the caller)."""
        llguidance.numpy.fill_next_token_bitmask(self.matcher, self._words, 0)
        bits = (self._bitmask[0].unsqueeze(-1) >> _SHIFTS) & 1
        return bits.flatten()[: self.vocab_size].bool()

    def consume(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise RuntimeError(f"grammar refused token {token} it had allowed")

    def is_accepting(self) -> bool:
        return bool(self.matcher.is_accepting())

    def is_complete(self) -> bool:
        """Nothing but EOS may follow: the reply ends here with finish_reason `stop`."""
        return bool(self.matcher.is_stopped())
