"""`POST /v1/infer`: the Generator NIM's synchronous route (cookbook api-reference.md), a thin
translation into the native media path (api/nim/infer.py). Served at the root and under
`/nim/generator` (routes/nim.py); errors in the NIM envelope, bad input 422."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from worldserve.api.errors import NimInferRoute
from worldserve.api.jobs.idempotency import read_key
from worldserve.api.jobs.inputs import read_json
from worldserve.api.jobs.sync import ClientDisconnected, until_disconnect
from worldserve.api.jobs.views import warn
from worldserve.api.nim.infer import run_infer
from worldserve.api.nim.infer_rules import resolve
from worldserve.api.nim.infer_schema import parse_infer
from worldserve.api.services import ApiServices, media_service

router = APIRouter(route_class=NimInferRoute, tags=["nim"])

CLIENT_CLOSED = 499
RESOLUTION_HEADER = "X-Worldserve-Resolution"


def setup(services: ApiServices) -> bool:
    return services.media is not None


@router.post("/v1/infer", response_model=None)
async def infer(request: Request) -> Response:
    service = media_service(request)
    context = service.request_context()
    job = resolve(parse_infer(await read_json(request)), context.caps)
    key = await read_key(request)
    try:
        answer = await until_disconnect(request, run_infer(service, job, context, key))
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED)
    response = JSONResponse(answer.body, headers=answer.headers)
    if job.resolution_note:
        response.headers[RESOLUTION_HEADER] = job.resolution_note
    warn(response, answer.warnings)
    return response
