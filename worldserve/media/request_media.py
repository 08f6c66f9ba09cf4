"""The one media pass of a `/v1/videos` request: its uploads, the media policy, its references.

The api hands over the request's flattened fields and its files once and gets back every
conditioning image and video read and checked (encoded bytes), or the first error:

1. each uploaded file (`input_reference`, `video_reference`): name and size limit, then decoded
   once as an image or a video (a video `input_reference` conditions like `video_path`);
2. the media policy on the fields (forbidden fields, prompt lengths, every media reference,
   before anything is fetched);
3. each reference the fields name (`video_path`, `video_url`, `input_reference`,
   `reference_url`): data URL, http(s) URL or allowed local path, under the same limit.

Only string values are read: a field of another type is left to the api's schema, which
refuses it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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

VIDEO_FILE_FIELDS = ("input_reference", "video_reference")
VIDEO_FIELDS = ("video_path", "video_url")
REFERENCE_FIELDS = ("input_reference", "reference_url")


@dataclass
class RequestMedia:
    """A request's conditioning media, read and checked (encoded files)."""

    images: list[bytes] = field(default_factory=list)
    videos: list[bytes] = field(default_factory=list)


@dataclass(frozen=True)
class MediaRules:
    """What a request's media are read against: the policy, the upload limit, and whether the
    model takes a conditioning video."""

    policy: MediaPolicy
    max_upload_bytes: int
    video_conditioning: bool


async def read_request_media(fields: dict[str, Any], files: dict[str, list[Any]],
                             rules: MediaRules) -> RequestMedia:
    """Uploads, then the policy on `fields` (flattened), then the references `fields` name."""
    media = RequestMedia()
    for name, uploads in files.items():
        if name not in VIDEO_FILE_FIELDS:
            raise InvalidRequest(f"unexpected file field {name!r}", param=name)
        for upload in uploads:
            await _read_file(upload, name, rules, media)
    rules.policy.check_body(fields)
    for name in VIDEO_FIELDS:
        if value := _reference(fields, name):
            _require_video_conditioning(rules, name)
            media.videos.append(await _video(value, name, rules))
    for name in REFERENCE_FIELDS:
        value = _reference(fields, name)
        if value and rules.video_conditioning and is_video_reference(value):
            media.videos.append(await _video(value, name, rules))
        elif value:
            media.images.append(await read_image_reference(value, name, rules.max_upload_bytes,
                                                           rules.policy))
    if len(media.videos) > 1:
        raise InvalidRequest("give one conditioning video (video_path, video_url, "
                             "video_reference or a video input_reference)", param="video_path")
    return media


async def _read_file(upload: Any, name: str, rules: MediaRules, media: RequestMedia) -> None:
    data = await read_upload(upload, name, rules.max_upload_bytes)
    if name == "video_reference" or is_video_reference(upload.filename or "",
                                                       upload.content_type):
        _require_video_conditioning(rules, name)
        check_video(data, name)
        media.videos.append(data)
    else:
        check_image(data, name)
        media.images.append(data)


def _reference(fields: dict[str, Any], name: str) -> str | None:
    value = fields.get(name)
    return value if isinstance(value, str) and value else None


def _require_video_conditioning(rules: MediaRules, name: str) -> None:
    if not rules.video_conditioning:
        raise InvalidRequest("video conditioning is not supported by this model", param=name)


async def _video(value: str, name: str, rules: MediaRules) -> bytes:
    return await read_video_reference(value, name, rules.max_upload_bytes, rules.policy)
