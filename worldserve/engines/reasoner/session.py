"""One live reasoning session: retained segments beside its KV cache, and their bookkeeping.

The session decides what its cache must become (ranges to evict, a reset for re-prefill, the
next group of tokens to prefill); the step runner (`execute.py`) applies it to the cache. The
session itself never calls the runner.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field

import torch

from worldserve.engines.reasoner.contract import SequenceKV
from worldserve.engines.reasoner.prompt import FrameChunk
from worldserve.engines.reasoner.retention import (
    ASSISTANT_TEXT,
    SYSTEM,
    VIDEO,
    Segment,
    plan_eviction,
)
from worldserve.errors import Conflict
from worldserve.ipc.messages import ReasonerRetention, ReasonerSampling


class KVSessionState(enum.Enum):
    IDLE = "idle"  # waiting for a frame
    BUSY = "busy"  # one frame in flight
    DEAD = "dead"  # aborted or failed: cache released, only CloseSession is accepted


@dataclass
class CacheOps:
    """What a sequence cache must undergo before its next prefill: token ranges to evict (in
    this order) and whether to drop it all (re-prefill)."""

    evict: list[tuple[int, int]] = field(default_factory=list)
    reset: bool = False


@dataclass
class PrefillGroup:
    """The next tokens of a session to prefill in one forward (at most one image)."""

    segments: list[Segment]
    ids: list[int]
    image_segment: Segment | None


class KVSession:
    """Segments and KV cache in lockstep: the cache holds `seg.ids[:seg.num_cached]` of every
    segment, in order; uncached tokens (the newest chunk) only ever follow cached ones."""

    def __init__(self, session_id: str, system_prompt: str, question: str,
                 retention: ReasonerRetention, sampling: ReasonerSampling, grammar: str | None,
                 kv: SequenceKV, device: torch.device | str = "cpu") -> None:
        self.session_id = session_id
        self.system_prompt = system_prompt
        self.question = question
        self.retention = retention
        self.sampling = sampling
        self.grammar = grammar
        self.state = KVSessionState.IDLE
        self.kv: SequenceKV | None = kv
        self.segments: list[Segment] = []
        self.pending_token: int | None = None  # the previous reply's last sampled token (not fed)
        self.frames = 0  # replies delivered
        self.generator = torch.Generator(device=device)
        if sampling.seed is not None:
            self.generator.manual_seed(sampling.seed)
        else:
            self.generator.seed()
        self._reply_start = 0

    # ------------------------------------------------------------------ state

    def begin_frame(self) -> None:
        if self.state is KVSessionState.DEAD:
            raise Conflict("session is no longer usable; create a new session")
        if self.state is KVSessionState.BUSY:
            raise Conflict("session busy: a frame is already being processed")
        self.state = KVSessionState.BUSY

    def end_frame(self) -> None:
        if self.state is KVSessionState.BUSY:
            self.state = KVSessionState.IDLE

    def kill(self) -> None:
        """Mark dead and release the cache at once."""
        self.state = KVSessionState.DEAD
        self.kv = None
        self.segments = []

    @property
    def is_first_frame(self) -> bool:
        return not self.segments

    @property
    def retained_tokens(self) -> int:
        return sum(len(s) for s in self.segments)

    @property
    def num_images(self) -> int:
        return sum(1 for s in self.segments if s.image is not None)

    # ------------------------------------------------------------------ frames

    def add_chunk(self, chunk: FrameChunk, max_tokens: int, context_len: int,
                  position_limit: float) -> tuple[CacheOps, int]:
        """Append the frame's segments and plan eviction (spec 11.2) and, past
        `position_limit`, a re-prefill (spec 12). Returns the cache operations and the number
        of evicted segments. Raises InvalidRequest (nothing changed) when the frame does not
        fit."""
        assert self.kv is not None
        candidate = [dataclasses.replace(s, age=s.age + 1) for s in self.segments]
        if chunk.closing_ids and candidate and candidate[-1].kind == ASSISTANT_TEXT:
            last = candidate[-1]
            candidate[-1] = dataclasses.replace(last, ids=last.ids + chunk.closing_ids)
        first = not candidate
        candidate.append(Segment(SYSTEM if first else VIDEO, list(chunk.turn_ids), pinned=first,
                                 image=chunk.image))
        plan = plan_eviction(candidate, self.retention, max_tokens, context_len)
        ops = CacheOps()
        for index in reversed(plan.evict):
            start = sum(s.num_cached for s in candidate[:index])
            ops.evict.append((start, start + candidate[index].num_cached))
        evicted = set(plan.evict)
        self.segments = [s for i, s in enumerate(candidate) if i not in evicted]
        cached = len(self.kv) - sum(end - start for start, end in ops.evict)
        ops.reset = cached > 0 and self.kv.max_position > position_limit
        if ops.reset:
            for seg in self.segments:
                seg.num_cached = 0
        return ops, len(plan.evict)

    def has_uncached(self) -> bool:
        return any(s.num_cached < len(s) for s in self.segments)

    def next_group(self, max_group_tokens: int) -> PrefillGroup:
        """The next group of uncached segment tails to prefill in one forward (at most one
        image, about `max_group_tokens` tokens)."""
        group: list[Segment] = []
        num_tokens = 0
        for seg in self.segments:
            todo = len(seg) - seg.num_cached
            if todo == 0:
                continue
            has_image = seg.image is not None and seg.num_cached == 0
            group_has_image = any(g.image is not None and g.num_cached == 0 for g in group)
            if group and (num_tokens + todo > max_group_tokens or (has_image and group_has_image)):
                break
            group.append(seg)
            num_tokens += todo
        ids: list[int] = []
        image_seg = None
        for seg in group:
            ids += seg.ids[seg.num_cached:]
            if seg.image is not None and seg.num_cached == 0:
                image_seg = seg
        return PrefillGroup(group, ids, image_seg)

    @staticmethod
    def mark_cached(group: PrefillGroup) -> None:
        for seg in group.segments:
            seg.num_cached = len(seg)

    def begin_reply(self) -> None:
        assert self.kv is not None
        self._reply_start = len(self.kv)

    def end_reply(self, last_token: int) -> None:
        """The fed reply tokens become an assistant_text segment; the last sampled token waits
        to open the next frame's chunk (spec 10, rule 2)."""
        assert self.kv is not None
        fed = self.kv.ids[self._reply_start:]
        self.segments.append(Segment(ASSISTANT_TEXT, list(fed), num_cached=len(fed)))
        self.pending_token = last_token
        self.frames += 1
