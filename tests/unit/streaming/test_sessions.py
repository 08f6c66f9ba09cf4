"""StreamSession states and the registry's idle expiry, without a server."""

from __future__ import annotations

import time

import pytest

from worldserve.api.streaming.sessions import SessionRegistry, StreamSession, StreamSessionState
from worldserve.errors import InternalError, NotFound
from worldserve.ipc.messages import ReasonerRetention, ReasonerSampling


def session(session_id: str = "sess-1", idle_s: float = 60.0) -> StreamSession:
    return StreamSession(session_id=session_id, transport="rest", model="m", fps=1.0,
                   retention=ReasonerRetention(), sampling=ReasonerSampling(),
                   idle_timeout_s=idle_s)


def test_legal_and_illegal_transitions() -> None:
    s = session()
    s.move(StreamSessionState.BUSY)
    s.move(StreamSessionState.DEAD)
    with pytest.raises(InternalError, match="dead -> busy"):
        s.move(StreamSessionState.BUSY)
    s.move(StreamSessionState.CLOSING)
    s.move(StreamSessionState.CLOSED)
    with pytest.raises(InternalError):
        s.move(StreamSessionState.IDLE)


def test_busy_sessions_never_expire() -> None:
    s = session(idle_s=0.0)
    later = time.monotonic() + 10
    assert s.is_expired(later)
    s.move(StreamSessionState.BUSY)
    assert not s.is_expired(later)


async def test_registry_expires_on_lookup_and_releases_once() -> None:
    released: list[str] = []

    async def release(s: StreamSession) -> None:
        released.append(s.session_id)

    registry = SessionRegistry(release, interval_s=60)
    fresh, stale = session("sess-fresh"), session("sess-stale", idle_s=0.01)
    registry.add(fresh)
    registry.add(stale)
    time.sleep(0.02)
    assert await registry.lookup("sess-fresh") is fresh
    with pytest.raises(NotFound, match="sess-stale"):
        await registry.lookup("sess-stale")
    assert stale.state == StreamSessionState.CLOSED and stale.expired.is_set()
    assert await registry.reap_expired() == 0
    assert released == ["sess-stale"]
    assert len(registry) == 1
