"""The error taxonomy, mapped to HTTP status and WebSocket close code in one table.

Engines and services raise these; the api maps them with `http_status()` / `ws_close_code()`
and renders OpenAI-style bodies with `error_body()`. Stage processes send them across the
socket as `ErrorReply(code=...)`; `from_code()` turns the code back into the same class.
"""

from __future__ import annotations

import re
from typing import Any


class WorldserveError(Exception):
    """Base class. `code` is the stable, wire-visible name of the error kind."""

    code = "internal_error"
    error_type = "server_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequest(WorldserveError, ValueError):
    code = "invalid_request"
    error_type = "invalid_request_error"


class AuthenticationRequired(WorldserveError):
    code = "authentication_required"
    error_type = "authentication_error"


class PermissionDenied(WorldserveError):
    code = "permission_denied"
    error_type = "permission_error"


class NotFound(WorldserveError, LookupError):
    code = "not_found"
    error_type = "not_found_error"


class Expired(NotFound):
    """A job whose outputs retention removed (output_ttl_s): gone, and the 404 says so."""

    code = "expired"


class Conflict(WorldserveError):
    code = "conflict"
    error_type = "conflict_error"


class PayloadTooLarge(WorldserveError):
    code = "payload_too_large"
    error_type = "invalid_request_error"


class UnsupportedMediaType(WorldserveError):
    code = "unsupported_media_type"
    error_type = "invalid_request_error"


class NotSupported(WorldserveError):
    """The server is configured without the feature (e.g. streaming state unavailable)."""

    code = "not_implemented"
    error_type = "not_implemented_error"


class UpstreamError(WorldserveError):
    code = "upstream_error"
    error_type = "upstream_error"


class CapacityExceeded(WorldserveError):
    """Load shed by an admission point; `retry_after_s` is its estimate of when a slot frees
    (api/retry_after.py), sent as `Retry-After`."""

    code = "capacity_exceeded"
    error_type = "server_overloaded"

    def __init__(self, message: str, *, param: str | None = None,
                 retry_after_s: float | None = None) -> None:
        super().__init__(message, param=param)
        self.retry_after_s = retry_after_s


class StageUnavailable(WorldserveError):
    """A stage process is down, failed, or not ready."""

    code = "stage_unavailable"
    error_type = "service_unavailable"

    def __init__(self, message: str, *, stage: str | None = None) -> None:
        super().__init__(message)
        self.stage = stage


class WeightsReleased(StageUnavailable):
    """The stage is up but its weights are off the device (POST /admin/memory/release)."""

    code = "weights_released"


class StorageFull(WorldserveError):
    """The output directory's disk is full: an output or a job record cannot be written."""

    code = "storage_full"
    error_type = "server_error"


class RequestTimeout(WorldserveError, TimeoutError):
    code = "timeout"
    error_type = "timeout_error"


class IdleTimeout(WorldserveError):
    """A WebSocket session expired without an accepted frame (streaming-reasoning §6.1)."""

    code = "idle_timeout"
    error_type = "timeout_error"


class InternalError(WorldserveError):
    code = "internal_error"
    error_type = "server_error"


class SessionLost(WorldserveError):
    """The replica that held the session's state is gone (cluster mode); nothing migrates."""

    code = "session_lost"
    error_type = "session_lost_error"


class ReplicaLost(WorldserveError):
    """The replica running an unfinished job is gone (cluster mode); the job failed."""

    code = "replica_lost"
    error_type = "server_error"


# class -> (HTTP status, WebSocket close code). The one place where statuses and close codes
# are decided. Close codes follow streaming-reasoning §8.4: 1008 for protocol, configuration,
# admission (capacity included), session and idle errors; 1011 for failures on our side. (1009
# for an oversized message comes from the WebSocket stack, before the app sees it.)
_TABLE: dict[type[WorldserveError], tuple[int, int]] = {
    InvalidRequest: (400, 1008),
    AuthenticationRequired: (401, 1008),
    PermissionDenied: (403, 1008),
    NotFound: (404, 1008),
    IdleTimeout: (408, 1008),
    Conflict: (409, 1008),
    SessionLost: (410, 1008),
    PayloadTooLarge: (413, 1008),
    UnsupportedMediaType: (415, 1008),
    NotSupported: (501, 1011),
    UpstreamError: (502, 1011),
    CapacityExceeded: (503, 1008),
    StageUnavailable: (503, 1011),
    WeightsReleased: (503, 1011),
    RequestTimeout: (504, 1011),
    StorageFull: (507, 1011),  # RFC 4918 Insufficient Storage
    ReplicaLost: (503, 1011),
    InternalError: (500, 1011),
    WorldserveError: (500, 1011),
}

_BY_CODE: dict[str, type[WorldserveError]] = {cls.code: cls for cls in _TABLE}


def _entry(exc: WorldserveError) -> tuple[int, int]:
    for cls in type(exc).__mro__:
        if cls in _TABLE:
            return _TABLE[cls]  # type: ignore[index]
    return _TABLE[WorldserveError]


def http_status(exc: WorldserveError) -> int:
    return _entry(exc)[0]


def ws_close_code(exc: WorldserveError) -> int:
    return _entry(exc)[1]


def from_code(code: str, message: str) -> WorldserveError:
    """Rebuild the exception a stage reported (unknown codes become InternalError)."""
    return _BY_CODE.get(code, InternalError)(message)


# An absolute filesystem path of two or more parts: not inside a URL (`http://host/a/b`) and not
# one of the server's own routes, which messages name on purpose (`no route GET /v1/x`).
_SERVER_PATH = re.compile(
    r"(?<![\w:/.~-])/(?!v1/|v2/|nim/|admin/|web/)(?:[^\s'\"/:,;()\[\]]+/)+[^\s'\"/:,;()\[\]]*")


def redact_paths(message: str) -> str:
    """`message` with each absolute path cut to its last part (`.../config.json`)."""
    return _SERVER_PATH.sub(
        lambda m: ".../" + m.group(0).rstrip("/").rsplit("/", 1)[-1], message)


def public_message(exc: WorldserveError) -> str:
    """What a client may read of `exc`. A failure on our side (5xx: an engine exception, a
    stage's last words) may carry an OS error's path; the client never sees the server's
    layout. A 4xx message stays whole: it quotes the client's own input."""
    return redact_paths(exc.message) if http_status(exc) >= 500 else exc.message


def error_body(exc: WorldserveError) -> dict[str, Any]:
    """OpenAI-style error body: {"error": {"message", "type", "code", "param"}}."""
    return {
        "error": {
            "message": public_message(exc),
            "type": exc.error_type,
            "code": exc.code,
            "param": exc.param,
        }
    }
