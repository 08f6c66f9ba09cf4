"""Video job routes (spec native-media.md §4): create, list, retrieve, content, delete.

Each route reads its request in one pass (api/jobs/inputs.py), makes one MediaService call,
and renders the record (api/jobs/views.py), with what the server changed or ignored in
`X-Worldserve-Warning`. `POST /v1/videos/sync` runs the same job to its end (api/jobs/sync.py).
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import FileResponse

from worldserve.api.errors import NativeRoute
from worldserve.api.jobs.idempotency import read_key
from worldserve.api.jobs.inputs import read_video
from worldserve.api.jobs.records import JobRecord
from worldserve.api.jobs.service import MediaService
from worldserve.api.jobs.sync import ClientDisconnected, run_video, until_disconnect
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


@router.post("/v1/videos")
async def create(request: Request, response: Response) -> dict[str, Any]:
    service = _service(request)
    video = await read_video(request, service.request_context())
    key = await read_key(request)
    warn(response, video.warnings)
    return _view(request, service, await service.create_video(video, key))


@router.post("/v1/videos/sync", response_model=None)
async def create_sync(request: Request) -> Response:
    """SGLang's and vLLM-Omni's blocking form (`Accept: video/mp4`): the same job as
    `POST /v1/videos`, awaited; the MP4 bytes of its first output, the job in headers."""
    service = _service(request)
    video = await read_video(request, service.request_context())
    key = await read_key(request)
    try:
        record = await until_disconnect(request, run_video(service, video, key))
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED)
    path = service.video_file(record.id, None)
    response = FileResponse(path, media_type="video/mp4", filename=path.name,
                            headers=sync_headers(record))
    warn(response, video.warnings)
    return response


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


@router.get("/v1/videos/{video_id}/content")
async def content(
    request: Request, video_id: str, variant: str | None = Query(None)
) -> FileResponse:
    service = _service(request)
    path = service.video_file(video_id, variant)
    return FileResponse(path, media_type="video/mp4", filename=path.name,
                        headers=server_timing(service.get_video(video_id)))


@router.delete("/v1/videos/{video_id}")
async def delete(request: Request, video_id: str) -> dict[str, Any]:
    service = _service(request)
    job = _view(request, service, await service.delete_video(video_id))
    job.update(status="deleted", deleted=True)
    return job
