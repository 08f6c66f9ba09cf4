"""Action routes (spec native-media.md §5): generations (JSON / msgpack / multipart), metadata.

Served in the protocol the generation stage declares (`action_api`, api/jobs/actions.py);
without one both answer 404 naming what is missing.
"""

from __future__ import annotations

from typing import Any

import msgpack
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from worldserve.api.errors import NativeRoute
from worldserve.api.jobs import actions
from worldserve.api.schemas.actions import encode_numpy
from worldserve.api.services import ApiServices, media_service

router = APIRouter(tags=["actions"], route_class=NativeRoute)

MSGPACK_TYPE = "application/msgpack"


def setup(services: ApiServices) -> bool:
    return services.media is not None


@router.get("/v1/actions/metadata")
async def metadata(request: Request) -> dict[str, Any]:
    return actions.metadata(media_service(request))


@router.post("/v1/actions/generations")
async def generations(request: Request) -> Response:
    use_msgpack = "msgpack" in (request.headers.get("content-type", "") +
                                request.headers.get("accept", "")).lower()
    body = await actions.generate(request, media_service(request), use_msgpack)
    if use_msgpack:
        return Response(msgpack.packb(body, default=encode_numpy, use_bin_type=True),
                        media_type=MSGPACK_TYPE)
    return JSONResponse(body)
