"""Helpers shared by the realtime engine unit tests."""

from __future__ import annotations

from worldserve.engines.realtime.engine import RealtimeEngine
from worldserve.ipc.messages import Message, RealtimeChunk
from worldserve.models.causal_dit.dev import lingbot_world_state, upstream_wan_state

__all__ = ["lingbot_world_state", "upstream_wan_state"]


class Replies:
    """Collects what an engine sends back, like the stage loop's reply function."""

    def __init__(self) -> None:
        self.items: list[Message] = []

    def __call__(self, message: Message) -> None:
        self.items.append(message)

    def last(self) -> Message:
        return self.items[-1]


def chunk(session_id: str, index: int, **fields) -> RealtimeChunk:
    fields.setdefault("prompt", "a red car" if index == 0 else None)
    return RealtimeChunk(request_id=f"{session_id}-{index}-{fields.pop('tag', '')}",
                         session_id=session_id, chunk_index=index, **fields)


def run_session(engine: RealtimeEngine, session_id: str, num_chunks: int, **first) -> list:
    """Submit and run chunks one by one; returns the replies."""
    out = Replies()
    for k in range(num_chunks):
        engine.submit(chunk(session_id, k, **(first if k == 0 else {})), out)
        while engine.has_work():
            engine.step()
    return out.items
