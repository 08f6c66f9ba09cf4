"""Image routes (spec native-media.md §3): generations, edits, content."""

from __future__ import annotations

import base64
import time
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse

from worldserve.api.jobs.bodies import (
    is_multipart,
    is_urlencoded,
    prepare,
    read_form,
    read_json,
    require_json_or_form,
    validate,
)
from worldserve.api.jobs.enhancer import maybe_enhance
from worldserve.api.jobs.http import NativeRoute
from worldserve.api.jobs.params import resolve_image
from worldserve.api.jobs.service import MediaService
from worldserve.api.services import ApiServices, media_service
from worldserve.api.schemas.images import ImageGenerationRequest
from worldserve.errors import InvalidRequest, NotFound
from worldserve.media.images import content_type_for
from worldserve.media.uploads import read_image_reference, read_upload

router = APIRouter(tags=["images"], route_class=NativeRoute)

EDIT_FILE_FIELDS = ("image", "image[]")
EDIT_URL_FIELDS = ("url", "url[]")


def setup(services: ApiServices) -> bool:
    return services.media is not None


_service = media_service


@router.post("/v1/images/generations")
async def generations(request: Request) -> dict[str, Any]:
    service = _service(request)
    require_json_or_form(request)
    payload = prepare(await read_json(request), service.policy)
    body = validate(ImageGenerationRequest, payload)
    return await _generate(service, body, [], default_response_format="url")


@router.post("/v1/images/edits")
async def edits(request: Request) -> dict[str, Any]:
    service = _service(request)
    if not (is_multipart(request) or is_urlencoded(request)):
        raise InvalidRequest("images/edits takes multipart/form-data with 'image' files or 'url'")
    form = await read_form(request)
    limit = service.runtime.config.max_upload_bytes
    images: list[bytes] = []
    for name in EDIT_FILE_FIELDS:
        for upload in form.files.pop(name, []):
            images.append(await read_upload(upload, name, limit))
    form.files.pop("mask", None)  # accepted, ignored (spec §3.2)
    if form.files:
        raise InvalidRequest(f"unexpected file field(s): {', '.join(sorted(form.files))}")
    urls: list[str] = []
    for name in EDIT_URL_FIELDS:
        value = form.fields.pop(name, None)
        urls += value if isinstance(value, list) else ([value] if value else [])
    payload = prepare(form.fields, service.policy)
    for url in urls:
        images.append(await read_image_reference(url, "url", limit, service.policy))
    if not images:
        from fastapi.exceptions import RequestValidationError

        raise RequestValidationError([{"type": "missing", "loc": ("body", "image"),
                                       "msg": "Field 'image' or 'url' is required"}])
    from worldserve.media.images import check_image

    for image in images:
        check_image(image, "image")
    body = validate(ImageGenerationRequest, payload)
    return await _generate(service, body, images, default_response_format="b64_json")


async def _generate(service: MediaService, body: ImageGenerationRequest, images: list[bytes], *,
                    default_response_format: str) -> dict[str, Any]:
    resolved = resolve_image(body, service.capabilities().defaults,
                             default_response_format=default_response_format)
    resolved.params.prompt = await maybe_enhance(service.enhancer, body.enhance_prompt, resolved.params.prompt)
    resolved.params.condition_images = images
    record = await service.generate_images(resolved, {
        "num_input_images": len(images), "response_format": resolved.response_format})
    return _image_response(service, record, resolved.response_format)


def _image_response(service: MediaService, record: dict[str, Any], response_format: str) -> dict:
    paths = service.paths(record)
    hide = service.config.hide_file_paths
    data = []
    for i, path in enumerate(paths):
        url = f"/v1/images/{record['id']}/content" + (f"?variant={i}" if len(paths) > 1 else "")
        item = {"b64_json": None, "url": None, "revised_prompt": record["revised_prompt"],
                "file_path": None if hide else str(path)}
        if response_format == "b64_json":
            item["b64_json"] = base64.b64encode(path.read_bytes()).decode()
        else:
            item["url"] = url
        data.append(item)
    return {"id": record["id"], "created": record["created_at"] or int(time.time()), "data": data,
            "peak_memory_mb": record.get("peak_memory_mb"),
            "inference_time_s": record.get("inference_time_s"),
            "usage": {"image_count": len(paths)}}


@router.get("/v1/images/{image_id}/content")
async def content(request: Request, image_id: str, variant: str | None = Query(None)) -> FileResponse:
    service = _service(request)
    record = service.store.get(image_id, "image")
    if record is None or (record.get("expires_at") or float("inf")) <= time.time():
        raise NotFound("Image not found", param="image_id")
    paths = service.paths(record)
    index = 0
    if variant is not None:
        if not variant.isdigit() or int(variant) >= max(1, len(paths)):
            raise NotFound(f"Image variant {variant} not found", param="variant")
        index = int(variant)
    if record["status"] in ("failed", "cancelled"):
        raise NotFound(f"Image generation {record['status']}")
    if index >= len(paths) or not paths[index].is_file():
        raise NotFound("Image is still being generated")
    path = paths[index]
    return FileResponse(path, media_type=content_type_for(path.name), filename=path.name,
                        content_disposition_type="attachment")
