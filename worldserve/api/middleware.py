"""ASGI middleware: per-route request metrics (HTTP and WebSocket)."""

from __future__ import annotations

import time
from typing import Any

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
