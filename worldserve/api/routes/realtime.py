"""Realtime world exploration: `WS /v1/realtime_video/generate` (SGLang protocol, spec
realtime-video.md) and `WS /v1/realtime/video` (vLLM-Omni protocol, docs/realtime.md)."""

from __future__ import annotations

from fastapi import APIRouter, WebSocket
from fastapi.responses import JSONResponse

from worldserve.api.errors import status_headers
from worldserve.api.realtime.connection import RealtimeConnection
from worldserve.api.realtime.omni import OmniRealtimeConnection
from worldserve.api.services import ApiServices, realtime_service, services_of
from worldserve.errors import StageUnavailable, error_body

router = APIRouter(tags=["realtime"])


def setup(services: ApiServices) -> bool:
    """Register the route only when the realtime stage is enabled."""
    return services.realtime is not None


@router.websocket("/v1/realtime_video/generate")
async def realtime_generate(websocket: WebSocket) -> None:
    await _serve(websocket, RealtimeConnection)


@router.websocket("/v1/realtime/video")
async def realtime_video(websocket: WebSocket) -> None:
    """vLLM-Omni's realtime video protocol (api/realtime/omni.py) on the same sessions."""
    await _serve(websocket, OmniRealtimeConnection)


async def _serve(websocket: WebSocket,
                 connection: type[RealtimeConnection] | type[OmniRealtimeConnection]) -> None:
    """Either protocol: refuse the upgrade with 503 while the realtime stage is down, else run
    the protocol's connection on a tracked socket."""
    service = realtime_service(websocket)
    try:
        service.client()  # a crashed realtime stage: refuse the upgrade with 503
    except StageUnavailable as exc:
        await websocket.send_denial_response(JSONResponse(
            status_code=503, content=error_body(exc),
            headers=status_headers(websocket, 503, exc)))
        return
    async with services_of(websocket).sockets.track(websocket):
        await connection(websocket, service).run()
