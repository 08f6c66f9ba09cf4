"""Reasoning blocks in chat replies (`<think>...</think>`, as the Qwen3 and Cosmos3 chat
templates write them): the split of a reply into reasoning and content, and the thinking-token
budget that closes a block.

A reply is in a block from its start when the rendered prompt left one open (the template wrote
`<think>` after the assistant header, `enable_thinking`), or from a `<think>` that leads the
reply. The block ends at `</think>`. vLLM's `thinking_token_budget` semantics: once a reply has
spent the budget inside its block, the tokens of `</think>` are forced next and the reply goes on
as content. A grammar (`response_format`, `guided_*`) constrains the content only.
"""

from __future__ import annotations

THINK_START = "<think>"
THINK_END = "</think>"
MARKERS = (THINK_START, THINK_END)


def opens_thinking(prompt_text: str) -> bool:
    """The rendered prompt leaves a reasoning block open: the reply starts inside it."""
    return prompt_text.rstrip().endswith(THINK_START)


def split_reasoning(text: str, open_at_start: bool) -> tuple[str | None, str]:
    """(reasoning, content) of a reply; reasoning None when the reply has no block. A block
    that never closed (cut by max_tokens) is all reasoning."""
    start = 0
    if not open_at_start:
        lead = text.find(THINK_START)
        if lead < 0 or text[:lead].strip():
            return None, text
        start = lead + len(THINK_START)
    end = text.find(THINK_END, start)
    if end < 0:
        return text[start:], ""
    return text[start:end], text[end + len(THINK_END):]


class ThinkingState:
    """Where one reply stands in its reasoning block, and the tokens forced to close it.

    `update(text)` after every accepted token; `forced()` is the token the reply must take next
    (None: free). `close_ids` are the tokens of `</think>`."""

    def __init__(self, open_at_start: bool, budget: int | None, close_ids: list[int]) -> None:
        self.open_at_start = open_at_start
        self.budget = budget
        self.close_ids = close_ids
        self.inside = open_at_start
        self.num_tokens = 0  # tokens accepted inside the block
        self._queue: list[int] = []

    def forced(self) -> int | None:
        return self._queue[0] if self._queue else None

    def update(self, token: int, text: str, was_inside: bool) -> None:
        """Account for `token` (accepted while `was_inside`), `text` the reply so far."""
        if self._queue and token == self._queue[0]:
            self._queue.pop(0)
        if was_inside:
            self.num_tokens += 1
        reasoning, _ = split_reasoning(text, self.open_at_start)
        self.inside = reasoning is not None and THINK_END not in text
        if (self.inside and not self._queue and self.budget is not None
                and self.num_tokens >= self.budget):
            self._queue = list(self.close_ids)
