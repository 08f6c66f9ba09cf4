"""Helpers shared by the realtime engine unit tests."""

from __future__ import annotations

from worldserve.engines.realtime.engine import RealtimeEngine
from worldserve.ipc.messages import Message, RealtimeChunk, RealtimeOpen
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


CHUNK_FIELDS = set(RealtimeChunk.__struct_fields__)


def open_session(session_id: str, **settings) -> RealtimeOpen:
    settings.setdefault("prompt", "a red car")
    return RealtimeOpen(request_id=f"{session_id}-open", session_id=session_id, **settings)


def chunk(session_id: str, index: int, **fields) -> RealtimeChunk:
    return RealtimeChunk(request_id=f"{session_id}-{index}-{fields.pop('tag', '')}",
                         session_id=session_id, chunk_index=index, **fields)


def submit(engine: RealtimeEngine, session_id: str, index: int, reply, **fields) -> None:
    """Submit chunk `index`; for chunk 0, first the open with the fields that are settings."""
    if index == 0:
        settings = {k: v for k, v in fields.items() if k not in CHUNK_FIELDS | {"tag"}}
        engine.submit(open_session(session_id, **settings), Replies())
        fields = {k: v for k, v in fields.items() if k not in settings}
    engine.submit(chunk(session_id, index, **fields), reply)


def run_session(engine: RealtimeEngine, session_id: str, num_chunks: int, **first) -> list:
    """Submit and run chunks one by one; returns the replies."""
    out = Replies()
    for k in range(num_chunks):
        submit(engine, session_id, k, out, **(first if k == 0 else {}))
        while engine.has_work():
            engine.step()
    return out.items
