"""The api's one error-mapping module: where errors become HTTP responses and WebSocket errors.

Statuses and close codes come from the taxonomy table (`worldserve.errors`); this module only
renders them. Every HTTP error body is the OpenAI shape `{"error": {"message", "type", "param",
"code"}}`; where a surface's contract fixes more, it adds to that shape (docs/security.md):
- app-wide handlers (`install_error_handlers`), `OpenAIRoute` (chat, responses): `code` is the
  taxonomy's name (`invalid_request`), validation errors 422 app-wide, 400 on `OpenAIRoute`;
- `NativeRoute` (native media, spec native-media.md §2.4): plus `detail`, the upstream message
  SGLang clients read; `code` is the HTTP status;
- `NimRoute` (live reasoning, streaming-reasoning §9): `code` is the HTTP status, validation
  errors 400;
- `NimInferRoute` (the Generator NIM's `/v1/infer`, cookbook api-reference.md): `type` is the
  NIM error class, `code` the HTTP status, bad input 422;
- `ws_error` (streaming-reasoning §8.4, a WebSocket message, not an HTTP body):
  `{"op": "error", "message", "code", "fatal"}`.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Coroutine

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, HTTPConnection

from worldserve.api.retry_after import FLOOR_S, header_value
from worldserve.errors import (
    InternalError,
    InvalidRequest,
    StageUnavailable,
    WeightsReleased,
    WorldserveError,
    error_body,
    http_status,
    public_message,
)

log = logging.getLogger("worldserve.api")

WS_CLOSE_NORMAL = 1000
STAGE_STOPPED_DETAIL = "Generation runtime stopped"
_NATIVE_TYPES = {400: "invalid_request_error", 413: "invalid_request_error",
                 415: "invalid_request_error", 422: "invalid_request_error",
                 404: "not_found_error", 409: "conflict_error", 500: "server_error",
                 503: "service_unavailable_error"}

Renderer = Callable[[Request, WorldserveError], JSONResponse]
Handler = Callable[[Request], Coroutine[Any, Any, Response]]


def validation_message(exc: RequestValidationError | ValidationError) -> tuple[str, str | None]:
    """`field: problem` for each error; the first field is reported as `param`."""
    parts, first = [], None
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path")]
        field = ".".join(loc) or "body"
        first = first or field
        parts.append(f"{field}: {err.get('msg', 'invalid value')}")
    return "; ".join(parts) or "invalid request", first


def _log_server_error(request: Request, status: int, exc: WorldserveError) -> None:
    if status >= 500:
        log.warning("%s %s -> %d: %s", request.method, request.url.path, status, exc.message)


# --------------------------------------------------------------------------- app-wide handlers


def challenge_headers(status: int) -> dict[str, str] | None:
    """A 401 names the scheme it wants (RFC 9110 §11.6.1; native-media.md §1.1)."""
    return {"WWW-Authenticate": "Bearer"} if status == 401 else None


def retry_after_s(request: HTTPConnection, exc: WorldserveError) -> float:
    """When to retry a 503: the shedding admission point's estimate, the restart the
    supervisor expects for a dead stage, else 1 s (api/retry_after.py)."""
    estimate = getattr(exc, "retry_after_s", None)
    if estimate is not None:
        return estimate
    runtime = getattr(request.app.state, "runtime", None)
    stage = getattr(exc, "stage", None)
    back_at = runtime.stage_back_at.get(stage) if runtime is not None and stage else None
    return back_at - time.monotonic() if back_at is not None else FLOOR_S


def status_headers(request: HTTPConnection, status: int,
                   exc: WorldserveError) -> dict[str, str] | None:
    """Headers a status asks for: `WWW-Authenticate` on 401, `Retry-After` on every 503."""
    if status == 503:
        return {"Retry-After": header_value(retry_after_s(request, exc))}
    return challenge_headers(status)


async def _worldserve_error(request: Request, exc: WorldserveError) -> JSONResponse:
    status = http_status(exc)
    _log_server_error(request, status, exc)
    return JSONResponse(status_code=status, content=error_body(exc),
                        headers=status_headers(request, status, exc))


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    message, param = validation_message(exc)
    body = {"error": {"message": message, "type": "invalid_request_error",
                      "code": "validation_error", "param": param}}
    return JSONResponse(status_code=422, content=body)


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    message = exc.detail if isinstance(exc.detail, str) else "request failed"
    if exc.status_code == 404 and message == "Not Found":
        message = f"no route {request.method} {request.url.path}"
    body = {"error": {"message": message, "type": kind, "code": exc.status_code, "param": None}}
    return JSONResponse(status_code=exc.status_code, content=body, headers=exc.headers)


async def _client_gone(request: Request, exc: ClientDisconnect) -> Response:
    """The client closed its connection before sending its whole body: nobody reads an answer,
    and it is not the server's error (it was a 500 and an ERROR traceback, issue 34's soak)."""
    log.info("%s %s: the client went away before sending its whole body", request.method,
             request.url.path)
    return Response(status_code=400)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return JSONResponse(status_code=500, content=error_body(InternalError("internal server error")))


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(WorldserveError, _worldserve_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(ClientDisconnect, _client_gone)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _unexpected)


# --------------------------------------------------------------------------- native media


def native_envelope(status: int, detail: Any, message: str,
                    param: str | None = None) -> dict[str, Any]:
    return {"detail": detail,
            "error": {"message": message, "type": _NATIVE_TYPES.get(status, "server_error"),
                      "param": param, "code": status}}


def native_response(request: Request, exc: WorldserveError) -> JSONResponse:
    status = http_status(exc)
    detail = STAGE_STOPPED_DETAIL if isinstance(exc, StageUnavailable) else public_message(exc)
    # `detail` keeps the contract's fixed 503 text; the message says why the weights are gone.
    message = public_message(exc) if isinstance(exc, WeightsReleased) else detail
    _log_server_error(request, status, exc)
    return JSONResponse(status_code=status, headers=status_headers(request, status, exc),
                        content=native_envelope(status, detail, message, exc.param))


def native_validation_response(errors: list[dict[str, Any]]) -> JSONResponse:
    first = errors[0] if errors else {}
    loc = ".".join(str(p) for p in first.get("loc", ()))
    message = f"{loc}: {first.get('msg', 'invalid value')}" if loc else first.get("msg", "invalid")
    param = str(first["loc"][-1]) if first.get("loc") else None
    detail = [{k: v for k, v in e.items() if k in ("type", "loc", "msg")} for e in errors]
    return JSONResponse(status_code=422, content=native_envelope(422, detail, message, param))


class NativeRoute(APIRoute):
    """Route class of the native media routes: native envelope, validation errors 422."""

    def get_route_handler(self) -> Handler:
        original = super().get_route_handler()

        async def handler(request: Request) -> Response:
            try:
                return await original(request)
            except WorldserveError as exc:
                return native_response(request, exc)
            except RequestValidationError as exc:
                return native_validation_response(list(exc.errors()))

        return handler


# --------------------------------------------------------------------------- NIM generator

# The NIM's error classes by status (cookbook operations.md: `{"error": {"message", "type",
# "code"}}`, e.g. NotFoundError / 404).
_NIM_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 408: "RequestTimeoutError",
                    409: "ConflictError", 413: "RequestEntityTooLargeError",
                    415: "UnsupportedMediaTypeError", 422: "UnprocessableEntityError",
                    500: "InternalServerError", 501: "NotImplementedError",
                    503: "ServiceUnavailableError", 504: "GatewayTimeoutError"}


def nim_envelope(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message,
                      "type": _NIM_ERROR_TYPES.get(status, "InternalServerError"),
                      "param": param, "code": status}}


def nim_error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content=nim_envelope(status, message, param))


def nim_infer_response(request: Request, exc: WorldserveError) -> JSONResponse:
    """`/v1/infer`: request problems are 422 (the NIM's validation status), others keep theirs."""
    status = http_status(exc)
    if status == 400:
        status = 422
    _log_server_error(request, status, exc)
    return nim_error_response(status, public_message(exc), exc.param)


class NimInferRoute(APIRoute):
    """Route class of `POST /v1/infer`: NIM envelope; validation and bad input 422."""

    def get_route_handler(self) -> Handler:
        return _enveloped(super().get_route_handler(), nim_infer_response)


# --------------------------------------------------------------------------- live reasoning


def nim_body(exc: WorldserveError) -> dict[str, Any]:
    """streaming-reasoning §9's `{"error": {"message", "code": <status>}}`, plus the OpenAI
    shape's `type` and `param` (additive: NIM clients read `message` and `code`)."""
    return {"error": {"message": public_message(exc), "type": exc.error_type,
                      "param": exc.param, "code": http_status(exc)}}


def ws_error(exc: WorldserveError, *, fatal: bool) -> dict[str, Any]:
    return {"op": "error", "message": public_message(exc), "code": http_status(exc),
            "fatal": fatal}


def nim_response(request: Request, exc: WorldserveError) -> JSONResponse:
    status = http_status(exc)
    _log_server_error(request, status, exc)
    return JSONResponse(status_code=status, content=nim_body(exc),
                        headers=status_headers(request, status, exc))


def openai_response(request: Request, exc: WorldserveError) -> JSONResponse:
    status = http_status(exc)
    _log_server_error(request, status, exc)
    return JSONResponse(status_code=status, content=error_body(exc),
                        headers=status_headers(request, status, exc))


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
