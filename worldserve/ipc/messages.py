"""Every message that crosses a process boundary, as msgspec Structs.

Encoded as msgpack with a `type` tag (the class name); never pickle. Every class that
subclasses `Message` in this module is decodable (see `all_message_types()`). Sections:
control (all stages), then one section per engine.

Requests carry a `request_id` chosen by the api process; every reply to a request carries the
same id. A request gets exactly one terminal reply (a result or `ErrorReply`); streaming
requests may get non-terminal replies (progress, chunks) before it.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import msgspec

StageState = Literal["starting", "loading", "warming", "ready", "failed", "stopped"]


class Message(msgspec.Struct, tag=True, kw_only=True, omit_defaults=True):
    """Base of every cross-process message."""


class Request(Message):
    """A message from the api process that expects replies with the same `request_id`."""

    request_id: str


class Reply(Message):
    """A message from a stage that answers one request.

    `terminal` is False for intermediate replies (progress, chunks) of a streaming request.
    """

    terminal: ClassVar[bool] = True
    request_id: str


# --------------------------------------------------------------------------- control


class Hello(Request):
    """First message of an api client; the stage answers `StageInfo` once its models are loaded."""

    client_id: str


class StageInfo(Reply):
    stage: str
    pid: int
    state: StageState
    model: str
    model_path: str
    num_params: int
    # Engine facts the api needs to answer without a round trip (capabilities, defaults).
    capabilities: dict[str, Any] = {}


class StageStatus(Message):
    """Unsolicited: the stage's state changed (e.g. warming -> ready)."""

    stage: str
    state: StageState
    message: str = ""


class Ping(Request):
    pass


class StatsRequest(Request):
    pass


class StageStats(Reply):
    queue_depth: int
    running: int
    sessions: int = 0
    extra: dict[str, Any] = {}


class Cancel(Request):
    """Cancel the request `target_id` (best effort, at the next step boundary). No reply."""

    target_id: str


class Echo(Request):
    """Relay diagnostic: the stage loop answers with the same payload after `delay_ms`."""

    payload: bytes = b""
    delay_ms: float = 0.0


class EchoReply(Reply):
    payload: bytes = b""


class ErrorReply(Reply):
    """Terminal failure of one request; `code` is an `errors.WorldserveError.code`."""

    code: str
    message: str


# --------------------------------------------------------------------------- generation


# --------------------------------------------------------------------------- reasoner


# --------------------------------------------------------------------------- realtime


def all_message_types() -> tuple[type[Message], ...]:
    """Every concrete message class (every subclass of Message, at any depth)."""
    found: list[type[Message]] = []
    stack = list(Message.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if cls not in (Request, Reply):
            found.append(cls)
    return tuple(found)
