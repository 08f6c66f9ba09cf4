"""Image routes (spec native-media.md §3): generations, edits, content.

Each route reads its request in one pass (api/jobs/inputs.py), makes one MediaService call,
and renders the record (api/jobs/views.py), with what the server changed or ignored in
`X-Worldserve-Warning`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import FileResponse

from worldserve.api.errors import NativeRoute
from worldserve.api.jobs.idempotency import read_key
from worldserve.api.jobs.inputs import read_edit, read_images
from worldserve.api.jobs.records import JobRecord
from worldserve.api.jobs.service import MediaService
from worldserve.api.jobs.views import (
    image_response,
    public_base_url,
    server_timing,
    timing_headers,
    warn,
)
from worldserve.api.services import ApiServices, media_service
from worldserve.media.images import content_type_for

router = APIRouter(tags=["images"], route_class=NativeRoute)


def setup(services: ApiServices) -> bool:
    return services.media is not None


_service = media_service


def _view(request: Request, service: MediaService, record: JobRecord,
          response: Response) -> dict[str, Any]:
    response.headers.update(timing_headers(record))
    return image_response(
        record,
        service.paths(record),
        base_url=public_base_url(request, service.runtime.config),
        hide_paths=service.runtime.hides_file_paths,
    )


@router.post("/v1/images/generations")
async def generations(request: Request, response: Response) -> dict[str, Any]:
    service = _service(request)
    images = await read_images(request, service.request_context())
    key = await read_key(request)
    warn(response, images.warnings)
    return _view(request, service, await service.generate_images(images, key), response)


@router.post("/v1/images/edits")
async def edits(request: Request, response: Response) -> dict[str, Any]:
    service = _service(request)
    edit = await read_edit(request, service.request_context())
    key = await read_key(request)
    warn(response, edit.warnings)
    return _view(request, service, await service.generate_images(edit, key), response)


@router.get("/v1/images/{image_id}/content")
async def content(
    request: Request, image_id: str, variant: str | None = Query(None)
) -> FileResponse:
    service = _service(request)
    path = service.image_file(image_id, variant)
    return FileResponse(
        path,
        media_type=content_type_for(path.name),
        filename=path.name,
        content_disposition_type="attachment",
        headers=server_timing(service.get_image(image_id)),
    )
