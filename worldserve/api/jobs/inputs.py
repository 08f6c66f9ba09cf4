"""The native media routes' parse step: HTTP request -> (validated body, input images).

Each reader takes the body as JSON or a form, applies flattening and the media policy
(bodies.prepare), validates it against the public schema, and loads the reference images
(uploads, URLs, paths) under the upload limit, checking each one once.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request
from fastapi.exceptions import RequestValidationError

from worldserve.api.jobs.bodies import (
    is_multipart,
    is_urlencoded,
    parse_body,
    prepare,
    read_form,
    read_json,
    read_payload,
    require_json_or_form,
    validate,
)
from worldserve.api.schemas.images import ImageGenerationRequest
from worldserve.api.schemas.videos import VideoCreateRequest
from worldserve.errors import InvalidRequest
from worldserve.media.images import check_image
from worldserve.media.policy import MediaPolicy
from worldserve.media.uploads import (
    is_video_reference,
    read_image_reference,
    read_upload,
    read_video_reference,
)
from worldserve.media.video import check_video

REFERENCE_FIELDS = ("input_reference", "reference_url")


@dataclass
class VideoInputs:
    body: VideoCreateRequest
    images: list[bytes]
    video: bytes | None = None
VIDEO_FIELDS = ("video_path", "video_url")
EDIT_FILE_FIELDS = ("image", "image[]")
EDIT_URL_FIELDS = ("url", "url[]")


async def read_video_request(request: Request, policy: MediaPolicy, limit: int,
                             video_conditioning: bool = False) -> VideoInputs:
    """`POST /v1/videos` (JSON or multipart with `input_reference` / `video_reference` files).
    An `input_reference` that is a video conditions like `video_path` (Cosmos3)."""
    form = await read_payload(request)
    images: list[bytes] = []
    videos: list[bytes] = []
    for name, uploads in form.files.items():
        if name == "video_reference" and not video_conditioning:
            raise InvalidRequest("video conditioning is not supported by this model", param=name)
        if name not in ("input_reference", "video_reference"):
            raise InvalidRequest(f"unexpected file field {name!r}", param=name)
        for upload in uploads:
            data = await read_upload(upload, name, limit)
            is_video = name == "video_reference" or is_video_reference(
                upload.filename or "", upload.content_type)
            (videos if is_video else images).append(_checked(data, name, is_video))
    body = parse_body(VideoCreateRequest, form.fields, policy, as_400=True)
    for name in VIDEO_FIELDS:
        value = getattr(body, name)
        if value and not video_conditioning:
            raise InvalidRequest("video conditioning is not supported by this model", param=name)
        if value:
            videos.append(await read_video_reference(value, name, limit, policy))
    for name in REFERENCE_FIELDS:
        value = getattr(body, name)
        if value and video_conditioning and is_video_reference(value):
            videos.append(await read_video_reference(value, name, limit, policy))
        elif value:
            images.append(await read_image_reference(value, name, limit, policy))
    if videos and not video_conditioning:
        raise InvalidRequest("video conditioning is not supported by this model",
                             param="video_path")
    if len(videos) > 1:
        raise InvalidRequest("give one conditioning video (video_path, video_url, "
                             "video_reference or a video input_reference)", param="video_path")
    for image in images:
        check_image(image, "input_reference")
    return VideoInputs(body, images, videos[0] if videos else None)


def _checked(data: bytes, field: str, is_video: bool) -> bytes:
    if is_video:
        check_video(data, field)
    return data


async def read_image_request(request: Request, policy: MediaPolicy) -> ImageGenerationRequest:
    """`POST /v1/images/generations` (JSON)."""
    require_json_or_form(request)
    return parse_body(ImageGenerationRequest, await read_json(request), policy)


async def read_edit_request(request: Request, policy: MediaPolicy,
                            limit: int) -> tuple[ImageGenerationRequest, list[bytes]]:
    """`POST /v1/images/edits` (a form with `image` files and/or `url` references)."""
    if not (is_multipart(request) or is_urlencoded(request)):
        raise InvalidRequest("images/edits takes multipart/form-data with 'image' files or 'url'")
    form = await read_form(request)
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
    payload = prepare(form.fields, policy)  # the policy before anything is fetched
    for url in urls:
        images.append(await read_image_reference(url, "url", limit, policy))
    if not images:
        raise RequestValidationError([{"type": "missing", "loc": ("body", "image"),
                                       "msg": "Field 'image' or 'url' is required"}])
    for image in images:
        check_image(image, "image")
    return validate(ImageGenerationRequest, payload), images
