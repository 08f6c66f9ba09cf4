"""Exception handlers: the one place where errors become HTTP responses."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from worldserve.errors import InternalError, WorldserveError, error_body, http_status

log = logging.getLogger("worldserve.api")


def validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """`field: problem` for each error; the first field is reported as `param`."""
    parts, first = [], None
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path")]
        field = ".".join(loc) or "body"
        first = first or field
        parts.append(f"{field}: {err.get('msg', 'invalid value')}")
    return "; ".join(parts) or "invalid request", first


def _json(status: int, body: dict) -> JSONResponse:
    return JSONResponse(status_code=status, content=body)


async def _worldserve_error(request: Request, exc: WorldserveError) -> JSONResponse:
    status = http_status(exc)
    if status >= 500:
        log.warning("%s %s -> %d: %s", request.method, request.url.path, status, exc.message)
    return _json(status, error_body(exc))


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    message, param = validation_message(exc)
    body = {"error": {"message": message, "type": "invalid_request_error",
                      "code": "validation_error", "param": param}}
    return _json(422, body)


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    message = exc.detail if isinstance(exc.detail, str) else "request failed"
    if exc.status_code == 404 and message == "Not Found":
        message = f"no route {request.method} {request.url.path}"
    body = {"error": {"message": message, "type": kind, "code": exc.status_code, "param": None}}
    return JSONResponse(status_code=exc.status_code, content=body, headers=exc.headers)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return _json(500, error_body(InternalError("internal server error")))


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(WorldserveError, _worldserve_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _unexpected)
