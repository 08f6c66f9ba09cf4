"""What the listener answers while the stages start, and the hand-over to the full app.

The port is bound before any stage loads (api/server.py), so a probe or a client that connects
during start-up must get an answer at once, not a connection that hangs for a minute:
- `GET /v1/health/live`: 200 (the process is alive);
- `GET /health`, `GET /v1/health/ready`: 503 `starting` with each stage's progress;
- `GET /version`: 200;
- any other route: 503 with a message and `Retry-After` (the envelope of native-media §2.4,
  whose `detail` SGLang clients read and whose `error` object every other client reads);
  a WebSocket upgrade gets the same 503.

`StartupApp.hand_over(app)` enters the full app's lifespan (the retention sweeper) and routes
every later request to it; uvicorn's lifespan shutdown leaves that lifespan again.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

import worldserve
from worldserve.api.errors import native_envelope
from worldserve.api.retry_after import header_value

log = logging.getLogger("worldserve.api")

# stage -> {"state", "elapsed_s", ...}: the supervisor's view of the stages' start
Progress = Callable[[], dict[str, dict[str, Any]]]
STARTING_RETRY_AFTER_S = 2.0


def starting_message(progress: dict[str, dict[str, Any]]) -> str:
    """Which stages are still loading and for how long, e.g. `generation loading for 12 s`."""
    pending = [f"{name} {entry['state']} for {entry.get('elapsed_s', 0):.0f} s"
               for name, entry in progress.items() if entry["state"] != "ready"]
    waiting = "; ".join(pending) or "finishing start-up"
    return f"the server is starting ({waiting}); retry shortly"


class StartupApp:
    """The ASGI app uvicorn serves from the moment the port is bound."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._app: ASGIApp | None = None
        self._lifespans = contextlib.AsyncExitStack()

    @property
    def handed_over(self) -> bool:
        return self._app is not None

    async def hand_over(self, app: Any) -> None:
        """Start `app`'s lifespan, then route every new request to it."""
        await self._lifespans.enter_async_context(app.router.lifespan_context(app))
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif self._app is not None:
            await self._app(scope, receive, send)
        elif scope["type"] == "websocket":  # refuse the upgrade with the same 503
            await WebSocket(scope, receive, send).send_denial_response(self._starting(scope))
        else:
            await self._starting(scope)(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self._lifespans.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _starting(self, scope: Scope) -> JSONResponse:
        path = scope.get("path", "")
        if path == "/v1/health/live":
            return JSONResponse({"object": "health.response", "status": "live",
                                 "message": "Service is live."})
        if path == "/version":
            return JSONResponse({"version": worldserve.__version__})
        progress = self._progress()
        states = {name: entry["state"] for name, entry in progress.items()}
        if path == "/health":
            return JSONResponse(status_code=503, content={
                "status": "starting", "running": True, "stages": states, "progress": progress})
        if path == "/v1/health/ready":
            return JSONResponse(status_code=503, content={
                "object": "health.response", "status": "starting",
                "message": "Service is starting.", "stages": states, "progress": progress})
        message = starting_message(progress)
        return JSONResponse(status_code=503, content=native_envelope(503, message, message),
                            headers={"Retry-After": header_value(STARTING_RETRY_AFTER_S)})
