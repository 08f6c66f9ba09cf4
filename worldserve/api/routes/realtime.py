"""`WS /v1/realtime_video/generate`: realtime world exploration (spec realtime-video.md)."""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from worldserve.api.realtime.connection import RealtimeConnection
from worldserve.api.realtime.service import STAGE, RealtimeService
from worldserve.api.runtime import ServerRuntime

router = APIRouter(tags=["realtime"])


def setup(runtime: ServerRuntime) -> bool:
    """Register the route only when the realtime stage is enabled."""
    if STAGE not in runtime.clients:
        return False
    runtime.services["realtime"] = RealtimeService(runtime)
    return True


@router.websocket("/v1/realtime_video/generate")
async def realtime_generate(websocket: WebSocket) -> None:
    service: RealtimeService = websocket.app.state.runtime.services["realtime"]
    await RealtimeConnection(websocket, service).run()
