"""The interactions of one vLLM-Omni realtime session and the chunks they take effect in.

vLLM-Omni names interactions by client strings (`event_id`); `SessionControls` tags updates
with integers. The ledger keeps the two apart and reports, per chunk, the ids of
`video.chunk_metadata`: `started_event_ids` (interactions first sampled into this chunk),
`active_event_ids` (the latest prompt and camera interactions in effect) and
`completed_event_ids` (the ones whose change is complete: every change here is a hard switch at
the chunk boundary, so an interaction completes in the chunk it starts). A prompt replaced
before the next boundary is still reported as started and completed there.
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass
from typing import Any

from worldserve.api.realtime.controls import ControlUpdate, PromptUpdate
from worldserve.api.realtime.omni_messages import InvalidMessage

MAX_CHUNKS_REMEMBERED = 8  # ids wait here from sampling until their chunk is written


@dataclass(frozen=True)
class ChunkEventIds:
    started: list[str]
    active: list[str]
    completed: list[str]


class EventLedger:
    def __init__(self) -> None:
        self._tags = itertools.count(1)
        self._known: set[str] = set()
        self._pending: list[tuple[str, bool, bool]] = []  # (id, has prompt, has camera)
        self._active_prompt: str | None = None
        self._active_camera: str | None = None
        self._by_chunk: dict[int, ChunkEventIds] = {}

    def new_event_id(self, raw: Any) -> str:
        """The interaction's id (a fresh one when the client gave none); not yet registered."""
        if raw is None:
            return uuid.uuid4().hex
        if not isinstance(raw, str) or not raw:
            raise InvalidMessage("session.interaction event_id must be a non-empty string",
                                 "interaction.event_id")
        if raw in self._known:
            raise InvalidMessage("event_id_conflict", "interaction.event_id",
                                 "event_id_conflict")
        return raw

    def queue(self, event_id: str, updates: list[ControlUpdate]) -> int:
        """Register an accepted interaction; returns its integer control tag."""
        self._known.add(event_id)
        has_prompt = any(isinstance(u, PromptUpdate) for u in updates)
        self._pending.append((event_id, has_prompt, not has_prompt or len(updates) > 1))
        return next(self._tags)

    def chunk_started(self, chunk_index: int) -> None:
        """The controls of `chunk_index` were just sampled: the queued interactions start."""
        started = [event_id for event_id, _, _ in self._pending]
        for event_id, has_prompt, has_camera in self._pending:
            if has_prompt:
                self._active_prompt = event_id
            if has_camera:
                self._active_camera = event_id
        self._pending = []
        active = list(dict.fromkeys(i for i in (self._active_prompt, self._active_camera) if i))
        self._by_chunk[chunk_index] = ChunkEventIds(started, active, list(started))
        for old in [i for i in self._by_chunk if i <= chunk_index - MAX_CHUNKS_REMEMBERED]:
            del self._by_chunk[old]

    def ids_for(self, chunk_index: int) -> tuple[list[str], list[str], list[str]]:
        ids = self._by_chunk.pop(chunk_index, ChunkEventIds([], [], []))
        return ids.started, ids.active, ids.completed
