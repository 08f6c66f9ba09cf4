"""Image routes (spec native-media.md §3): generations, edits, content.

Each route parses (api/jobs/inputs.py), makes one MediaService call, and renders the record
(api/jobs/views.py).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse

from worldserve.api.errors import NativeRoute
from worldserve.api.jobs.inputs import read_edit_request, read_image_request
from worldserve.api.jobs.records import JobRecord
from worldserve.api.jobs.service import MediaService
from worldserve.api.jobs.views import image_response, public_base_url
from worldserve.api.services import ApiServices, media_service
from worldserve.errors import InvalidRequest
from worldserve.media.images import content_type_for

router = APIRouter(tags=["images"], route_class=NativeRoute)


def setup(services: ApiServices) -> bool:
    return services.media is not None


_service = media_service


def _view(request: Request, service: MediaService, record: JobRecord) -> dict[str, Any]:
    return image_response(
        record,
        service.paths(record),
        base_url=public_base_url(request, service.runtime.config),
        hide_paths=service.config.hide_file_paths,
    )


@router.post("/v1/images/generations")
async def generations(request: Request) -> dict[str, Any]:
    service = _service(request)
    body = await read_image_request(request, service.policy)
    record = await service.generate_images(
        body, [], default_response_format=service.capabilities().defaults.image_response_format)
    return _view(request, service, record)


@router.post("/v1/images/edits")
async def edits(request: Request) -> dict[str, Any]:
    service = _service(request)
    caps = service.capabilities()
    if not caps.image_edits:
        raise InvalidRequest(
            f"{caps.pipeline} has no image-edit mode: to condition generation on an image, "
            "POST /v1/videos with the image as input_reference (num_frames > 1)",
            param="image")
    body, images = await read_edit_request(
        request, service.policy, service.runtime.config.max_upload_bytes
    )
    record = await service.generate_images(body, images, default_response_format="b64_json")
    return _view(request, service, record)


@router.get("/v1/images/{image_id}/content")
async def content(
    request: Request, image_id: str, variant: str | None = Query(None)
) -> FileResponse:
    path = _service(request).image_file(image_id, variant)
    return FileResponse(
        path,
        media_type=content_type_for(path.name),
        filename=path.name,
        content_disposition_type="attachment",
    )
