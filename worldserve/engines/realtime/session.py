"""The bounded table of realtime world sessions (spec realtime-video.md section 6.1).

Each session's tensors (KV cache, VAE decode state, RNG) live in the object its runner's
`new_session()` returned; the table only orders, bounds and releases them.
"""

from __future__ import annotations

from collections import OrderedDict

from worldserve.engines.realtime.contract import WorldSession


class SessionTable:
    """Sessions by id, least recently used first; bounded as a safety net against lost releases."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._sessions: OrderedDict[str, WorldSession] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions

    def get(self, session_id: str) -> WorldSession | None:
        session = self._sessions.get(session_id)
        if session is not None:
            self._sessions.move_to_end(session_id)
        return session

    def put(self, session: WorldSession) -> list[WorldSession]:
        """Insert (replacing and releasing an older state of the same id); returns the
        least-recently-used sessions evicted to stay within capacity (already released)."""
        self.pop(session.session_id)
        self._sessions[session.session_id] = session
        evicted = []
        while len(self._sessions) > self.capacity:
            _, old = self._sessions.popitem(last=False)
            old.release()
            evicted.append(old)
        return evicted

    def pop(self, session_id: str) -> WorldSession | None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            session.release()
        return session

    def values(self) -> list[WorldSession]:
        return list(self._sessions.values())
