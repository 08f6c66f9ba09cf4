"""The message bases (`Message`, `Request`, `Reply`) and the control messages every stage
answers; see the package docstring."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import msgspec

from worldserve.ipc.capabilities import (  # noqa: F401  (re-exported: session parameters)
    Capabilities,
    ReasonerRetention,
    ReasonerSampling,
)

# `released`: the stage is up but its weights are off the device (POST /admin/memory/release).
StageState = Literal["starting", "loading", "warming", "ready", "released", "failed", "stopped"]


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
    # Engine facts the api needs to answer without a round trip (ipc/capabilities.py).
    capabilities: Capabilities | None = None


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


