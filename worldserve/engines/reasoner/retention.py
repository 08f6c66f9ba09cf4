"""Segments of a session's retained context and the eviction plan (spec sections 11.1-11.2).

Pure bookkeeping: no tensors. The session applies a plan to its KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from worldserve.errors import InvalidRequest
from worldserve.ipc.messages import ReasonerRetention

SYSTEM, VIDEO, ASSISTANT_TEXT, USER_TEXT = "system_prompt", "video", "assistant_text", "user_text"
TEXT_KINDS = (ASSISTANT_TEXT, USER_TEXT)
DOES_NOT_FIT = "frame does not fit in the session context"


@dataclass
class Segment:
    """A contiguous token range of the retained context.

    `ids[:num_cached]` are in the KV cache; the rest wait for prefill (only the newest segments
    have uncached tokens). `encoded` keeps the vision output of a video segment's image so a
    re-prefill does not re-run the vision tower.
    """

    kind: str
    ids: list[int]
    pinned: bool = False
    age: int = 0
    image: Any = None
    encoded: Any = None
    num_cached: int = 0

    def __len__(self) -> int:
        return len(self.ids)


@dataclass
class EvictionPlan:
    evict: list[int] = field(default_factory=list)  # segment indices, ascending
    retained_tokens: int = 0


def _evictable(seg: Segment, kinds: tuple[str, ...] | None) -> bool:
    return not seg.pinned and seg.age > 0 and (kinds is None or seg.kind in kinds)


def plan_eviction(segments: list[Segment], retention: ReasonerRetention, max_tokens: int,
                  context_len: int) -> EvictionPlan:
    """Three phases (video cap, text cap, session-token cap), oldest first; pinned and age-0
    segments are never evicted. Raises InvalidRequest when the result cannot hold the reply."""
    alive = list(range(len(segments)))

    def evict_oldest(kinds: tuple[str, ...] | None) -> bool:
        for i in alive:
            if _evictable(segments[i], kinds):
                alive.remove(i)
                return True
        return False

    def count(kinds: tuple[str, ...]) -> int:
        return sum(1 for i in alive if segments[i].kind in kinds and not segments[i].pinned)

    def tokens(kinds: tuple[str, ...] | None) -> int:
        return sum(len(segments[i]) for i in alive
                   if kinds is None or (segments[i].kind in kinds and not segments[i].pinned))

    while count((VIDEO,)) > retention.max_video_segments and evict_oldest((VIDEO,)):
        pass
    if retention.max_text_tokens is not None:
        while tokens(TEXT_KINDS) > retention.max_text_tokens and evict_oldest(TEXT_KINDS):
            pass
    while tokens(None) > retention.max_session_tokens and evict_oldest(None):
        pass
    retained = tokens(None)
    if retained + max_tokens > context_len:
        raise InvalidRequest(DOES_NOT_FIT)
    evicted = sorted(set(range(len(segments))) - set(alive))
    return EvictionPlan(evicted, retained)
