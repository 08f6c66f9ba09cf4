"""What the realtime engine needs from a world-model runner (a family satisfies it structurally).

The engine owns sessions' order, bounds and validation; the runner owns every tensor of a
session (its KV cache, decoder state and RNG live in the object `new_session()` returns).
"""

from __future__ import annotations

from typing import Any, Protocol

from worldserve.models.types import (
    ChunkRunOutput,
    RealtimeModelFacts,
    WorldSessionSettings,
    WorldSessionState,
)


class SessionCache(Protocol):
    """Size facts of one session's cache (stats and replies)."""

    @property
    def num_frames(self) -> int: ...

    @property
    def num_tokens(self) -> int: ...

    def nbytes(self) -> int: ...


class WorldSession(Protocol):
    """One world session's model state, as `RealtimeRunner.new_session()` returns it."""

    session_id: str
    settings: WorldSessionSettings
    next_chunk: int  # the chunk index the session accepts next
    state: WorldSessionState
    cache: SessionCache

    def release(self) -> None:
        """Free every tensor of the session (idempotent)."""


class RealtimeRunner(Protocol):
    model: Any  # the loaded model (the engine only hands it to tests and benchmarks)
    facts: RealtimeModelFacts  # defaults, limits and controls of the checkpoint
    upsampling: int  # output frames per latent frame after the first
    num_params: int

    def new_session(self, session_id: str, settings: WorldSessionSettings,
                    prompt: str) -> WorldSession: ...

    def chunk_frames(self, chunk_index: int, frames_per_block: int) -> int:
        """Output frames of chunk `chunk_index` (the first may be shorter)."""

    def run_chunk(self, session: Any, camera: list[list[str]] | None, prompt: str | None = None,
                  refresh_kv: bool = False) -> ChunkRunOutput: ...
