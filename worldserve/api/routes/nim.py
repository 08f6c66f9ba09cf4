"""NIM-compatible mounts, one per runtime the server serves: `/nim/generator/v1/...` and
`/nim/reasoner/v1/...` (cookbook operations.md). A NIM profile serves one runtime per port; a
Cosmos3 directory holds both, so each client points `NIM_URL` at its runtime's prefix.

Each mount has the NIM's discovery routes (metadata, health, models, manifest, version, license,
metrics) describing its own runtime, the runtime's inference routes (the same route handlers as
the root: one path into the same services), the runtime-aware 404 for the other runtime's
primary routes, and a NIM-envelope 404 for anything else under its prefix.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from worldserve.api.errors import nim_error_response
from worldserve.api.model_names import model_entries, served_model
from worldserve.api.nim.profile import (
    FOREIGN_ROUTES,
    LICENSE,
    STAGES,
    NimRuntime,
    foreign_route_message,
    health_body,
    manifest_body,
    metadata_body,
    version_body,
)
from worldserve.api.routes import chat, infer, ops, responses, streaming
from worldserve.api.services import ApiServices

PREFIX = "/nim/{kind}"
ANY_METHOD = ["GET", "POST", "PUT", "PATCH", "DELETE"]


def routers(services: ApiServices) -> list[APIRouter]:
    out = []
    if services.media is not None:
        out.append(_mount("generator", [infer.router]))
    if services.chat is not None:
        reasoner = [chat.router, responses.router]
        if services.streaming is not None:
            reasoner.append(streaming.router)
        out.append(_mount("reasoner", reasoner))
    return out


def _mount(kind: NimRuntime, inference: list[APIRouter]) -> APIRouter:
    prefix = PREFIX.format(kind=kind)
    # out of /openapi.json: the same handlers are documented at the root
    mount = APIRouter(prefix=prefix, tags=[f"nim-{kind}"], include_in_schema=False)
    mount.include_router(_discovery(kind))
    for router in inference:
        mount.include_router(router)
    for path in FOREIGN_ROUTES[kind]:
        mount.add_api_route(path, _foreign(kind, path), methods=["POST"],
                            include_in_schema=False)
    mount.add_api_route("/{rest:path}", _not_found, methods=ANY_METHOD, include_in_schema=False)
    return mount


def _discovery(kind: NimRuntime) -> APIRouter:
    router = APIRouter()
    stages = (STAGES[kind],)

    @router.get("/v1/metadata")
    async def metadata(request: Request) -> dict[str, Any]:
        return metadata_body(request.app.state.runtime, kind)

    @router.get("/v1/health/ready")
    async def ready(request: Request) -> JSONResponse:
        status, body = health_body(request.app.state.runtime, kind)
        return JSONResponse(status_code=status, content=body)

    @router.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        return {"object": "list", "data": model_entries(request.app.state.runtime, stages)}

    @router.get("/v1/models/{model_id:path}")
    async def model(request: Request, model_id: str) -> dict[str, Any]:
        return served_model(request.app.state.runtime, model_id, stages)

    @router.get("/v1/manifest")
    async def manifest(request: Request) -> dict[str, Any]:
        return manifest_body(request.app.state.runtime, kind)

    router.add_api_route("/v1/health/live", _live, methods=["GET"])
    router.add_api_route("/v1/version", version_body, methods=["GET"])
    router.add_api_route("/v1/license", _license, methods=["GET"])
    router.add_api_route("/v1/metrics", ops.metrics, methods=["GET"])
    return router


async def _live() -> dict[str, str]:
    return {"object": "health.response", "message": "Service is live", "status": "live"}


async def _license() -> dict[str, str]:
    return dict(LICENSE)


def _foreign(kind: NimRuntime, path: str) -> Any:
    async def wrong_runtime() -> Response:
        return nim_error_response(404, foreign_route_message(kind, path))

    return wrong_runtime


async def _not_found(request: Request, rest: str) -> Response:
    return nim_error_response(404, f"no route {request.method} {request.url.path}")
