"""`WS /v1/realtime_video/generate`: realtime world exploration (spec realtime-video.md)."""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from worldserve.api.realtime.connection import RealtimeConnection
from worldserve.api.services import ApiServices, realtime_service

router = APIRouter(tags=["realtime"])


def setup(services: ApiServices) -> bool:
    """Register the route only when the realtime stage is enabled."""
    return services.realtime is not None


@router.websocket("/v1/realtime_video/generate")
async def realtime_generate(websocket: WebSocket) -> None:
    await RealtimeConnection(websocket, realtime_service(websocket)).run()
