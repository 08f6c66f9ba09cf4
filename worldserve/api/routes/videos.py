"""Video job routes (spec native-media.md §4): create, remix, list, retrieve, content, delete.

Each route reads its request in one pass (api/jobs/inputs.py, after other servers' field names
are mapped: api/jobs/video_aliases.py), makes one MediaService call, and renders the record
(api/jobs/views.py), with what the server changed or ignored in `X-Worldserve-Warning`.
`POST /v1/videos/sync` runs the same job to its end (api/jobs/sync.py) and answers its MP4 or,
with `format=safetensors`, its tensors (api/jobs/video_outputs.py), as do the content variants
`thumbnail` and `spritesheet`.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import FileResponse

from worldserve.api.errors import NativeRoute
from worldserve.api.jobs import video_outputs
from worldserve.api.jobs.idempotency import read_key
from worldserve.api.jobs.inputs import read_payload, video_request
from worldserve.api.jobs.params import MediaRequest
from worldserve.api.jobs.records import JobRecord
from worldserve.api.jobs.remix import remix_request
from worldserve.api.jobs.service import MediaService
from worldserve.api.jobs.sync import ClientDisconnected, run_video, until_disconnect
from worldserve.api.jobs.video_aliases import answer_format, map_aliases, named_as
from worldserve.api.jobs.views import (
    job_list,
    job_object,
    public_base_url,
    server_timing,
    sync_headers,
    warn,
)
from worldserve.api.services import ApiServices, media_service
from worldserve.errors import InvalidRequest

router = APIRouter(tags=["videos"], route_class=NativeRoute)

CLIENT_CLOSED = 499  # nginx's status for a request the client abandoned (nobody reads it)
DEFAULT_PAGE = 100
MAX_PAGE = 100
ORDERS = ("asc", "desc")
IMAGE_VARIANTS = {"thumbnail": video_outputs.thumbnail,
                  "spritesheet": video_outputs.spritesheet}  # JPEGs of the job's frames


def setup(services: ApiServices) -> bool:
    return services.media is not None


_service = media_service


def _view(request: Request, service: MediaService, record: JobRecord) -> dict[str, Any]:
    return job_object(
        record,
        service.paths(record),
        base_url=public_base_url(request, service.runtime.config),
        hide_paths=service.runtime.hides_file_paths,
    )


async def _read(request: Request, service: MediaService, *, sync: bool = False,
                query_format: str | None = None) -> tuple[MediaRequest, str]:
    """The validated job request and the body a synchronous answer takes (`mp4` for a job)."""
    body = await read_payload(request)
    renamed = map_aliases(body)
    fmt = answer_format(body.fields, query_format, sync)
    with named_as(renamed):
        video = await video_request(body.fields, service.request_context(), body.files)
    return video, fmt


@router.post("/v1/videos")
async def create(request: Request, response: Response) -> dict[str, Any]:
    service = _service(request)
    video, _ = await _read(request, service)
    key = await read_key(request)
    warn(response, video.warnings)
    return _view(request, service, await service.create_video(video, key))


@router.post("/v1/videos/sync", response_model=None)
@router.post("/v1/videos/generations", response_model=None)  # TensorRT-LLM's name for it
async def create_sync(request: Request, format: str | None = Query(None)) -> Response:
    """SGLang's and vLLM-Omni's blocking form (`Accept: video/mp4`): the same job as
    `POST /v1/videos`, awaited; the MP4 bytes of its first output (or, with `format`
    `safetensors` in the query or the body, as TensorRT-LLM answers, its tensors), the job in
    headers."""
    service = _service(request)
    video, fmt = await _read(request, service, sync=True, query_format=format)
    key = await read_key(request)
    try:
        record = await until_disconnect(request, run_video(service, video, key))
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED)
    path = service.video_file(record.id, None)
    response: Response
    if fmt == "safetensors":
        body = await asyncio.to_thread(video_outputs.tensor_body, path, record.action)
        response = Response(body, media_type=video_outputs.SAFETENSORS_TYPE,
                            headers={**sync_headers(record), "Content-Disposition":
                                     f'attachment; filename="{record.id}.safetensors"'})
    else:
        response = FileResponse(path, media_type="video/mp4", filename=path.name,
                                headers=sync_headers(record))
    warn(response, video.warnings)
    return response


@router.post("/v1/videos/{video_id}/remix")
async def remix(request: Request, response: Response, video_id: str) -> dict[str, Any]:
    """OpenAI's `videos.remix`: a new job conditioned on a completed job's video
    (api/jobs/remix.py)."""
    service = _service(request)
    source = service.get_video(video_id)
    video = await remix_request(service, source, await read_payload(request))
    key = await read_key(request)
    warn(response, video.warnings)
    return _view(request, service, await service.create_video(video, key))


def _page_params(limit: str | None, order: str | None) -> tuple[int, Literal["asc", "desc"]]:
    """`limit` 1..100 (default 100) and `order` asc|desc (default desc), else 400."""
    if order is not None and order not in ORDERS:
        raise InvalidRequest(
            f"order must be one of {', '.join(ORDERS)} (got {order!r})", param="order"
        )
    if limit is None:
        return DEFAULT_PAGE, order or "desc"  # type: ignore[return-value]
    if not limit.strip().isdigit() or not 1 <= int(limit) <= MAX_PAGE:
        raise InvalidRequest(
            f"limit must be an integer from 1 to {MAX_PAGE} (got {limit!r})", param="limit"
        )
    return int(limit), order or "desc"  # type: ignore[return-value]


@router.get("/v1/videos")
async def list_jobs(
    request: Request,
    after: str | None = Query(None),
    limit: str | None = Query(None),
    order: str | None = Query(None),
) -> dict[str, Any]:
    service = _service(request)
    page_size, direction = _page_params(limit, order)
    base_url = public_base_url(request, service.runtime.config)
    if service.runtime.job_lister is not None:  # several api replicas (cluster/listing.py)
        return await service.runtime.job_lister.page(after, page_size, direction == "desc",
                                                     base_url)
    records, has_more = service.list_videos(after, page_size, direction == "desc")
    return job_list(
        records,
        service.paths,
        has_more,
        base_url=base_url,
        hide_paths=service.runtime.hides_file_paths,
    )


@router.get("/v1/videos/{video_id}")
async def retrieve(request: Request, video_id: str) -> dict[str, Any]:
    service = _service(request)
    return _view(request, service, service.get_video(video_id))


@router.get("/v1/videos/{video_id}/content", response_model=None)
async def content(
    request: Request, video_id: str, variant: str | None = Query(None)
) -> Response:
    """The MP4 (`variant`: none, `video` or an output index), or a JPEG of its frames
    (`thumbnail`: the first; `spritesheet`: up to 25 in a grid)."""
    service = _service(request)
    image = IMAGE_VARIANTS.get(variant or "")
    path = service.video_file(video_id, None if image else variant)
    timing = server_timing(service.get_video(video_id))
    if image is not None:
        return Response(await asyncio.to_thread(image, path), media_type="image/jpeg",
                        headers=timing)
    return FileResponse(path, media_type="video/mp4", filename=path.name, headers=timing)


@router.delete("/v1/videos/{video_id}")
async def delete(request: Request, video_id: str) -> dict[str, Any]:
    service = _service(request)
    job = _view(request, service, await service.delete_video(video_id))
    job.update(status="deleted", deleted=True)
    return job
