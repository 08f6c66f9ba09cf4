"""ASGI middleware: per-route request metrics (HTTP and WebSocket), request body size limit,
forwarded headers from trusted proxies."""

from __future__ import annotations

import json
import time
from typing import Any

from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from worldserve.api.metrics import Metrics

Scope = dict[str, Any]


def route_label(scope: Scope) -> str:
    """The matched route's template (`/v1/videos/{video_id}`), never the raw path."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "unmatched"


class MetricsMiddleware:
    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = {"code": 500 if scope["type"] == "http" else 1000}

        async def send_wrapper(message: dict[str, Any]) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                status["code"] = message["status"]
            elif kind == "websocket.close":
                status["code"] = message.get("code", 1000)
            elif kind == "websocket.http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            method = scope.get("method", "WS")
            self.metrics.observe(route_label(scope), method, status["code"],
                                 time.perf_counter() - started)


def max_request_body_bytes(max_upload_bytes: int) -> int:
    """Largest HTTP request body: two uploads' worth (base64 inflates by 4/3) plus 1 MiB of
    fields, and never less than a 16 MiB frame message."""
    return max(2 * max_upload_bytes, 16 * 1024 * 1024) + 1024 * 1024


class BodyLimitMiddleware:
    """Refuse request bodies above `max_bytes` with 413 before they are buffered.

    A declared `Content-Length` above the limit is answered at once, without reading the body.
    A chunked body is counted as it streams: past the limit the 413 is sent, the route sees a
    client disconnect, and whatever the route would have answered is dropped."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.strip().isdigit()
                                     or int(declared) > self.max_bytes):
            await self._refuse(send)
            return
        state = {"received": 0, "refused": False}

        async def limited_receive() -> dict[str, Any]:
            if state["refused"]:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                state["received"] += len(message.get("body", b""))
                if state["received"] > self.max_bytes:
                    state["refused"] = True
                    await self._refuse(send)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: dict[str, Any]) -> None:
            if not state["refused"]:  # after a 413 nothing else goes out
                await send(message)

        await self.app(scope, limited_receive, guarded_send)

    async def _refuse(self, send: Any) -> None:
        message = (f"request body exceeds the limit of {self.max_bytes} bytes "
                   "(derived from --max-upload-bytes)")
        body = json.dumps({"detail": message, "error": {
            "message": message, "type": "invalid_request_error", "param": None,
            "code": 413}}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


class ForwardedHeadersMiddleware(ProxyHeadersMiddleware):
    """uvicorn's proxy-headers handling (X-Forwarded-Proto/For from `trusted_hosts` only), plus
    X-Forwarded-Host under the same trust, so `request.base_url` is the address the client used.

    Installed by create_app (uvicorn's own copy is switched off), so tests run it too.
    """

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        client = scope.get("client")
        if scope["type"] in ("http", "websocket") and client and client[0] in self.trusted_hosts:
            forwarded = dict(scope["headers"]).get(b"x-forwarded-host")
            host = forwarded.split(b",")[0].strip() if forwarded else b""
            if host:
                scope["headers"] = [(k, v) for k, v in scope["headers"] if k != b"host"]
                scope["headers"].append((b"host", host))
        await super().__call__(scope, receive, send)
