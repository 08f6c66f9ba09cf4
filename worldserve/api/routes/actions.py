"""Action routes (spec native-media.md §5): generations (JSON / msgpack / multipart), metadata.

Served in the protocol the generation stage declares (`action_api`, api/jobs/actions.py);
without one both answer 404 naming what is missing. `Idempotency-Key` on generations: the same
key with the same request (and answer encoding) gets the first answer's bytes again
(api/jobs/answers.py).
"""

from __future__ import annotations

from typing import Any

import msgpack
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from worldserve.api.errors import NativeRoute
from worldserve.api.jobs import actions
from worldserve.api.jobs.answers import Answer, answer_once, answer_ttl_s, with_variant
from worldserve.api.jobs.idempotency import read_key
from worldserve.api.jobs.inputs import is_multipart, read_form
from worldserve.api.schemas.actions import encode_numpy
from worldserve.api.services import ApiServices, media_service

router = APIRouter(tags=["actions"], route_class=NativeRoute)

MSGPACK_TYPE = "application/msgpack"
JSON_TYPE = "application/json"


def setup(services: ApiServices) -> bool:
    return services.media is not None


@router.get("/v1/actions/metadata")
async def metadata(request: Request) -> dict[str, Any]:
    return actions.metadata(media_service(request))


@router.post("/v1/actions/generations")
async def generations(request: Request) -> Response:
    use_msgpack = "msgpack" in (request.headers.get("content-type", "") +
                                request.headers.get("accept", "")).lower()
    service = media_service(request)
    if is_multipart(request):
        await read_form(request)  # parsed once under the upload limits; the key reads it back
    key = await read_key(request)
    if key is not None:
        key = with_variant(key, "msgpack" if use_msgpack else "json")

    async def answer() -> Answer:
        body = await actions.generate(request, service, use_msgpack)
        if use_msgpack:
            return msgpack.packb(body, default=encode_numpy, use_bin_type=True), MSGPACK_TYPE
        return bytes(JSONResponse(body).body), JSON_TYPE

    ttl_s = answer_ttl_s(service.runtime.config.output_ttl_s)
    content, media_type = await answer_once(service.keys, key, ttl_s, answer)
    return Response(content, media_type=media_type)
