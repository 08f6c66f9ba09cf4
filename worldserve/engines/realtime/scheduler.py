"""Fair round-robin over sessions with pending chunks (pure CPU logic, no torch).

Each session's chunks run strictly in arrival order; sessions take turns one chunk at a time
(spec realtime-video.md section 7.1). The queue is bounded per session: a client has at most a
few chunks in flight, so more than `max_pending_per_session` is a protocol error.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from worldserve.errors import CapacityExceeded
from worldserve.ipc.messages import RealtimeChunk
from worldserve.runtime.engine import ReplyFn


@dataclass
class PendingChunk:
    request: RealtimeChunk
    reply: ReplyFn
    received_at: float = field(default_factory=time.monotonic)


class RoundRobinQueue:
    def __init__(self, max_pending_per_session: int = 8) -> None:
        self.max_pending_per_session = max_pending_per_session
        self._queues: dict[str, deque[PendingChunk]] = {}
        self._turns: deque[str] = deque()

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def push(self, item: PendingChunk) -> None:
        sid = item.request.session_id
        queue = self._queues.setdefault(sid, deque())
        if len(queue) >= self.max_pending_per_session:
            raise CapacityExceeded(f"realtime session {sid} already has {len(queue)} chunks "
                                   "pending; wait for a result before sending more")
        queue.append(item)
        if sid not in self._turns:
            self._turns.append(sid)

    def pop(self) -> PendingChunk | None:
        """The next chunk of the session whose turn it is; that session goes to the back."""
        while self._turns:
            sid = self._turns.popleft()
            queue = self._queues.get(sid)
            if not queue:
                self._queues.pop(sid, None)
                continue
            item = queue.popleft()
            if queue:
                self._turns.append(sid)
            else:
                del self._queues[sid]
            return item
        return None

    def drop_session(self, session_id: str) -> list[PendingChunk]:
        dropped = list(self._queues.pop(session_id, ()))
        if session_id in self._turns:
            self._turns.remove(session_id)
        return dropped

    def drop_request(self, request_id: str) -> PendingChunk | None:
        for sid, queue in self._queues.items():
            for item in queue:
                if item.request.request_id == request_id:
                    queue.remove(item)
                    return item
        return None
