"""The native media surface's error envelope, mapped in one place (spec native-media.md §2.4).

Routes of this surface use `NativeRoute`: every WorldserveError or validation error they raise
becomes `{"detail": <message>, "error": {message, type, param, code: <HTTP status>}}`, the shape
SGLang clients (`detail`) and the OpenAI SDK (`error`) both read.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute

from worldserve.errors import CapacityExceeded, StageUnavailable, WorldserveError, http_status

log = logging.getLogger("worldserve.api.native")

STAGE_STOPPED_DETAIL = "Generation runtime stopped"
_TYPES = {400: "invalid_request_error", 413: "invalid_request_error", 415: "invalid_request_error",
          422: "invalid_request_error", 404: "not_found_error", 409: "conflict_error",
          500: "server_error", 503: "service_unavailable_error"}


def envelope(status: int, detail: Any, message: str, param: str | None = None) -> dict[str, Any]:
    return {"detail": detail,
            "error": {"message": message, "type": _TYPES.get(status, "server_error"),
                      "param": param, "code": status}}


def error_response(exc: WorldserveError) -> JSONResponse:
    status = http_status(exc)
    message = STAGE_STOPPED_DETAIL if isinstance(exc, StageUnavailable) else exc.message
    headers = {"Retry-After": "1"} if isinstance(exc, CapacityExceeded) else None
    if status >= 500:
        log.warning("native route -> %d: %s", status, exc.message)
    return JSONResponse(status_code=status, content=envelope(status, message, message, exc.param),
                        headers=headers)


def validation_response(errors: list[dict[str, Any]]) -> JSONResponse:
    first = errors[0] if errors else {}
    loc = ".".join(str(p) for p in first.get("loc", ()))
    message = f"{loc}: {first.get('msg', 'invalid value')}" if loc else first.get("msg", "invalid")
    param = str(first["loc"][-1]) if first.get("loc") else None
    detail = [{k: v for k, v in e.items() if k in ("type", "loc", "msg")} for e in errors]
    return JSONResponse(status_code=422, content=envelope(422, detail, message, param))


class NativeRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Any]:
        original = super().get_route_handler()

        async def handler(request: Request) -> Response:
            try:
                return await original(request)
            except WorldserveError as exc:
                return error_response(exc)
            except RequestValidationError as exc:
                return validation_response(list(exc.errors()))

        return handler
