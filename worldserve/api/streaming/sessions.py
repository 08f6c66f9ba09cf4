"""The api side of live sessions: state per session, the registry and its idle reaper.

The reasoner stage holds each session's cache; this registry holds what the routes need to
enforce the protocol: one frame in flight, dead sessions (409), idle expiry (404 / WebSocket 408).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Literal

from worldserve.api.retry_after import SlotClock
from worldserve.errors import InternalError, NotFound
from worldserve.ipc.messages import ReasonerRetention, ReasonerSampling

log = logging.getLogger("worldserve.api.streaming")

Transport = Literal["rest", "ws"]


class StreamSessionState(enum.Enum):
    IDLE = "idle"        # live, waiting for a frame
    BUSY = "busy"        # one frame in flight
    DEAD = "dead"        # frame timeout or engine failure: released, answers 409 until deleted
    CLOSING = "closing"  # delete in progress (waits for the frame in flight)
    CLOSED = "closed"    # deleted, expired or disconnected: gone from the registry


_S = StreamSessionState
_TRANSITIONS: dict[StreamSessionState, set[StreamSessionState]] = {
    _S.IDLE: {_S.BUSY, _S.CLOSING, _S.CLOSED},
    _S.BUSY: {_S.IDLE, _S.DEAD, _S.CLOSING},
    _S.DEAD: {_S.CLOSING, _S.CLOSED},
    _S.CLOSING: {_S.CLOSED},
    _S.CLOSED: set(),
}


@dataclass
class StreamSession:
    session_id: str
    transport: Transport
    model: str
    fps: float
    retention: ReasonerRetention
    sampling: ReasonerSampling
    idle_timeout_s: float
    frame_format: str | None = None
    state: StreamSessionState = StreamSessionState.IDLE
    num_frames: int = 0
    last_active: float = field(default_factory=time.monotonic)
    inflight: asyncio.Task | None = None
    inflight_request_id: str | None = None
    # Set when the reaper expires the session (the WebSocket connection waits on it).
    expired: asyncio.Event = field(default_factory=asyncio.Event)
    released: bool = False  # the stage has been told to drop the session's cache

    def move(self, new: StreamSessionState) -> None:
        if new not in _TRANSITIONS[self.state]:
            raise InternalError(f"session {self.session_id}: illegal transition "
                                f"{self.state.value} -> {new.value}")
        self.state = new

    def touch(self) -> None:
        self.last_active = time.monotonic()

    def is_expired(self, now: float) -> bool:
        """Idle past its timeout; a session with a frame in flight is never expired."""
        return (self.state in (StreamSessionState.IDLE, StreamSessionState.DEAD)
                and now - self.last_active > self.idle_timeout_s)


ReleaseFn = Callable[[StreamSession], Awaitable[None]]


class SessionRegistry:
    """Live sessions by id (REST and WebSocket), expired by a reaper every `interval_s`."""

    def __init__(self, release: ReleaseFn, interval_s: float) -> None:
        self._sessions: dict[str, StreamSession] = {}
        self._slots = SlotClock()
        self._slot_tokens: dict[str, int] = {}
        self._release = release
        self._interval_s = interval_s
        self._reaper: asyncio.Task | None = None

    def __len__(self) -> int:
        return len(self._sessions)

    def add(self, session: StreamSession) -> None:
        self._sessions[session.session_id] = session
        self._slot_tokens[session.session_id] = self._slots.hold()
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.get_running_loop().create_task(self._reap_forever())

    def sessions(self) -> list[StreamSession]:
        """A snapshot of the live sessions."""
        return list(self._sessions.values())

    def remove(self, session: StreamSession) -> None:
        self._sessions.pop(session.session_id, None)
        token = self._slot_tokens.pop(session.session_id, None)
        if token is not None:
            self._slots.release(token)

    def retry_after_s(self) -> float:
        """When a session slot should free: the sessions' mean lifetime against the oldest
        one's age, or sooner when an idle session reaches its idle timeout (api/retry_after)."""
        now = time.monotonic()
        idle = [s.last_active + s.idle_timeout_s - now for s in self._sessions.values()
                if s.state in (StreamSessionState.IDLE, StreamSessionState.DEAD)]
        return self._slots.retry_after_s(*idle, now_s=now)

    async def lookup(self, session_id: str) -> StreamSession:
        """The live session, or 404 (an idle one past its timeout is expired on the spot)."""
        session = self._sessions.get(session_id)
        if session is not None and session.is_expired(time.monotonic()):
            await self._expire(session)
            session = None
        if session is None:
            raise NotFound(f"session '{session_id}' not found; it was closed, expired or never "
                           "existed")
        return session

    async def reap_expired(self) -> int:
        now = time.monotonic()
        expired = [s for s in self._sessions.values() if s.is_expired(now)]
        for session in expired:
            await self._expire(session)
        return len(expired)

    async def _expire(self, session: StreamSession) -> None:
        log.info("session %s expired after %.0f s idle", session.session_id, session.idle_timeout_s)
        self.remove(session)
        session.move(StreamSessionState.CLOSED)
        session.expired.set()
        await self._release(session)

    async def _reap_forever(self) -> None:
        while self._sessions:
            await asyncio.sleep(self._interval_s)
            try:
                await self.reap_expired()
            except Exception:  # the reaper must survive one bad release
                log.exception("session reaper failed")
        self._reaper = None
