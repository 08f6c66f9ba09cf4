"""The one place where live-reasoning errors become responses.

NIM routes (spec section 9) answer `{"error": {"message", "code": <status>}}`; chat completions
answer the OpenAI shape. On both, request validation errors are 400, never 422. WebSocket errors
(spec section 8.4) are `{"op": "error", "message", "code", "fatal"}` with close 1008 or 1011.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Coroutine

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from worldserve.api.errors import validation_message
from worldserve.errors import (
    CapacityExceeded,
    InvalidRequest,
    WorldserveError,
    error_body,
    http_status,
)

log = logging.getLogger("worldserve.api.streaming")

WS_CLOSE_NORMAL = 1000
WS_CLOSE_POLICY = 1008
WS_CLOSE_INTERNAL = 1011


class IdleTimeout(WorldserveError):
    """A WebSocket session expired without an accepted frame (spec section 6.1)."""

    code = "idle_timeout"
    error_type = "timeout_error"


def nim_status(exc: WorldserveError) -> int:
    return 408 if isinstance(exc, IdleTimeout) else http_status(exc)


def nim_body(exc: WorldserveError) -> dict[str, Any]:
    return {"error": {"message": exc.message, "code": nim_status(exc)}}


def ws_error(exc: WorldserveError, *, fatal: bool) -> dict[str, Any]:
    return {"op": "error", "message": exc.message, "code": nim_status(exc), "fatal": fatal}


def ws_close_code(exc: WorldserveError) -> int:
    """1008 for protocol, configuration, admission, session and idle errors; 1011 otherwise."""
    if nim_status(exc) < 500 or isinstance(exc, CapacityExceeded):
        return WS_CLOSE_POLICY
    return WS_CLOSE_INTERNAL


def _log_server_error(request: Request, status: int, exc: WorldserveError) -> None:
    if status >= 500:
        log.warning("%s %s -> %d: %s", request.method, request.url.path, status, exc.message)


def nim_response(request: Request, exc: WorldserveError) -> JSONResponse:
    status = nim_status(exc)
    _log_server_error(request, status, exc)
    return JSONResponse(status_code=status, content=nim_body(exc))


def openai_response(request: Request, exc: WorldserveError) -> JSONResponse:
    status = http_status(exc)
    _log_server_error(request, status, exc)
    return JSONResponse(status_code=status, content=error_body(exc))


Renderer = Callable[[Request, WorldserveError], JSONResponse]
Handler = Callable[[Request], Coroutine[Any, Any, Response]]


def _enveloped(handler: Handler, render: Renderer) -> Handler:
    async def run(request: Request) -> Response:
        try:
            return await handler(request)
        except RequestValidationError as exc:
            message, param = validation_message(exc)
            return render(request, InvalidRequest(message, param=param))
        except WorldserveError as exc:
            return render(request, exc)

    return run


class NimRoute(APIRoute):
    """Route class of the NIM streaming routes: NIM envelope, validation errors -> 400."""

    def get_route_handler(self) -> Handler:
        return _enveloped(super().get_route_handler(), nim_response)


class OpenAIRoute(APIRoute):
    """Route class of the OpenAI-compatible routes: OpenAI envelope, validation errors -> 400."""

    def get_route_handler(self) -> Handler:
        return _enveloped(super().get_route_handler(), openai_response)
