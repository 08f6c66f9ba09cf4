"""Live video reasoning routes, NIM-compatible (spec streaming-reasoning.md sections 3-9).

Registered only when the reasoner stage is enabled with `streaming.enabled` (else 404). Errors
use the NIM envelope `{"error": {"message", "code"}}` through `NimRoute`.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import JSONResponse

from worldserve.api.errors import NimRoute
from worldserve.api.schemas.streaming import CreateSessionBody
from worldserve.api.services import ApiServices, services_of, streaming_service
from worldserve.api.streaming.connection import StreamingConnection
from worldserve.api.streaming.images import read_frame

router = APIRouter(route_class=NimRoute, tags=["streaming"])


def setup(services: ApiServices) -> bool:
    return services.streaming is not None


_service = streaming_service


@router.get("/v1/streaming/config")
async def streaming_config(request: Request) -> dict:
    return _service(request).config_view()


@router.post("/v1/streaming/sessions", status_code=201)
async def create_session(request: Request, body: CreateSessionBody) -> JSONResponse:
    service = _service(request)
    session = await service.create(body, "rest")
    return JSONResponse(status_code=201, content=service.created_view(session))


@router.post("/v1/streaming/sessions/{session_id}/frame")
async def submit_frame(request: Request, session_id: str) -> dict:
    service = _service(request)
    service.client()
    session = await service.registry.lookup(session_id)
    image = await read_frame(request)
    result = await service.frame(session, image)
    return service.frame_view(result)


@router.delete("/v1/streaming/sessions/{session_id}")
async def delete_session(request: Request, session_id: str) -> dict:
    service = _service(request)
    service.client()
    session = await service.registry.lookup(session_id)
    frames = await service.close(session)
    return {"session_id": session_id, "frames": frames, "closed": True}


@router.websocket("/v1/streaming/ws")
async def streaming_ws(websocket: WebSocket) -> None:
    async with services_of(websocket).sockets.track(websocket):
        await StreamingConnection(websocket, _service(websocket)).run()
