"""The api's open WebSockets (streaming and realtime), so an orderly shutdown can say goodbye.

On SIGTERM the server closes every tracked socket with 1001 `server shutting down` (spec
streaming-reasoning.md section 8.5, realtime-video.md section 4.5) before uvicorn's own shutdown,
which would otherwise send 1012 to whatever is still open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import AsyncIterator

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

log = logging.getLogger("worldserve.api")

WS_GOING_AWAY = 1001
SHUTDOWN_REASON = "server shutting down"
# How long the connection handlers get to run their cleanup after the close frame.
HANDLER_DRAIN_S = 2.0


class OpenSockets:
    def __init__(self) -> None:
        self._sockets: set[WebSocket] = set()
        self._handlers: set[asyncio.Task] = set()

    def __len__(self) -> int:
        return len(self._sockets)

    @contextlib.asynccontextmanager
    async def track(self, websocket: WebSocket) -> AsyncIterator[None]:
        """Around a connection handler: the socket is known while the handler runs."""
        self._sockets.add(websocket)
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            yield
        finally:
            self._sockets.discard(websocket)
            if task is not None:
                self._handlers.discard(task)

    async def close_all(self, code: int = WS_GOING_AWAY, reason: str = SHUTDOWN_REASON) -> int:
        """Close every accepted socket with `code` and `reason`, then give the handlers up to
        HANDLER_DRAIN_S to finish (their cleanup releases the sessions); return how many."""
        closed = 0
        for websocket in list(self._sockets):
            if await _close(websocket, code, reason):
                closed += 1
        handlers = [t for t in self._handlers if not t.done()]
        if handlers:
            await asyncio.wait(handlers, timeout=HANDLER_DRAIN_S)
        if closed:
            log.info("closed %d WebSocket(s) with %d (%s)", closed, code, reason)
        return closed


async def _close(websocket: WebSocket, code: int, reason: str) -> bool:
    if websocket.application_state != WebSocketState.CONNECTED:
        return False  # not accepted yet, or the handler already closed it
    if websocket.client_state == WebSocketState.DISCONNECTED:
        return False
    try:
        await websocket.close(code, reason)
    except (WebSocketDisconnect, RuntimeError, OSError):
        return False  # the peer left first
    return True
