"""Video job routes (spec native-media.md §4): create, list, retrieve, content, delete."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse

from worldserve.api.jobs.bodies import (
    is_multipart,
    prepare,
    read_form,
    read_json,
    require_json_or_form,
    validate,
)
from worldserve.api.jobs.enhancer import maybe_enhance
from worldserve.api.jobs.http import NativeRoute
from worldserve.api.jobs.params import resolve_video
from worldserve.api.jobs.service import MediaService
from worldserve.api.services import ApiServices, media_service
from worldserve.api.schemas.videos import VideoCreateRequest
from worldserve.errors import InvalidRequest, NotFound
from worldserve.media.uploads import read_image_reference, read_upload

router = APIRouter(tags=["videos"], route_class=NativeRoute)

DEFAULT_PAGE = 100
REFERENCE_FIELDS = ("input_reference", "reference_url")
VIDEO_FIELDS = ("video_path", "video_url")


def setup(services: ApiServices) -> bool:
    return services.media is not None


_service = media_service


@router.post("/v1/videos")
async def create(request: Request) -> dict[str, Any]:
    service = _service(request)
    require_json_or_form(request)
    limit = service.runtime.config.max_upload_bytes
    images: list[bytes] = []
    if is_multipart(request):
        form = await read_form(request)
        for name, uploads in form.files.items():
            if name == "video_reference":
                raise InvalidRequest("video conditioning is not supported by this model",
                                     param=name)
            if name != "input_reference":
                raise InvalidRequest(f"unexpected file field {name!r}", param=name)
            for upload in uploads:
                images.append(await read_upload(upload, name, limit))
        payload = form.fields
    else:
        payload = await read_json(request)
    payload = prepare(payload, service.policy)
    body = validate(VideoCreateRequest, payload, as_400=True)
    for name in VIDEO_FIELDS:
        if getattr(body, name):
            raise InvalidRequest("video conditioning is not supported by this model", param=name)
    for name in REFERENCE_FIELDS:
        value = getattr(body, name)
        if value:
            images.append(await read_image_reference(value, name, limit, service.policy))
    from worldserve.media.images import check_image

    for image in images:
        check_image(image, "input_reference")
    resolved = resolve_video(body, service.capabilities().defaults)
    resolved.params.prompt = await maybe_enhance(service.enhancer, body.enhance_prompt, resolved.params.prompt)
    resolved.params.condition_images = images[:1]
    record = await service.create_video(resolved, {"model": body.model or "sora-2"})
    return job_object(service, record)


@router.get("/v1/videos")
async def list_jobs(request: Request, after: str | None = Query(None),
                    limit: int | None = Query(None, ge=1, le=100),
                    order: str | None = Query("desc")) -> dict[str, Any]:
    service = _service(request)
    # Any order other than "asc" is treated as "desc" (spec §4.4).
    items, has_more = service.list_videos(after, limit or DEFAULT_PAGE, order != "asc")
    data = [job_object(service, r) for r in items]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": has_more}


@router.get("/v1/videos/{video_id}")
async def retrieve(request: Request, video_id: str) -> dict[str, Any]:
    service = _service(request)
    return job_object(service, service.get_video(video_id))


@router.get("/v1/videos/{video_id}/content")
async def content(request: Request, video_id: str, variant: str | None = Query(None)) -> FileResponse:
    service = _service(request)
    record = service.get_video(video_id)
    index = 0
    if variant is not None and variant != "video":
        if not variant.isdigit():
            raise NotFound(f"Variant {variant} not available", param="variant")
        index = int(variant)
    if record["status"] in ("failed", "cancelled"):
        raise NotFound(f"Video generation {record['status']}")
    paths = service.paths(record)
    if record["status"] != "completed" or not paths:
        raise NotFound("Generation is still in-progress")
    if index >= len(paths):
        raise NotFound(f"Variant {variant} not available", param="variant")
    if not paths[index].is_file():
        raise NotFound("Video file is missing from the output directory")
    return FileResponse(paths[index], media_type="video/mp4", filename=paths[index].name)


@router.delete("/v1/videos/{video_id}")
async def delete(request: Request, video_id: str) -> dict[str, Any]:
    service = _service(request)
    record = await service.delete_video(video_id)
    job = job_object(service, record)
    job.update(status="deleted", deleted=True)
    return job


def job_object(service: MediaService, record: dict[str, Any]) -> dict[str, Any]:
    """The public job object (spec §4.2) from a stored record."""
    paths = service.paths(record)
    completed = record["status"] == "completed"
    hide = service.config.hide_file_paths
    url = f"/v1/videos/{record['id']}/content"
    return {
        "id": record["id"], "object": "video", "model": record.get("model") or "sora-2",
        "status": record["status"], "progress": record["progress"],
        "created_at": record["created_at"], "size": record["size"],
        "seconds": record.get("seconds", "0"), "quality": "standard",
        "url": url if completed else None,
        "urls": [f"{url}?variant={i}" for i in range(len(paths))]
        if completed and len(paths) > 1 else None,
        "remixed_from_video_id": None, "completed_at": record.get("completed_at"),
        "expires_at": record.get("expires_at"), "error": record.get("error"),
        "file_path": str(paths[0]) if completed and paths and not hide else None,
        "file_paths": [str(p) for p in paths] if completed and not hide else None,
        "num_outputs": record.get("num_outputs", 1),
        "peak_memory_mb": record.get("peak_memory_mb"),
        "inference_time_s": record.get("inference_time_s"),
        "revised_prompt": record.get("revised_prompt"), "action": None,
    }
