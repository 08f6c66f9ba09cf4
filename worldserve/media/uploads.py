"""Reading request media into bytes: multipart uploads, data URLs, http(s) URLs, local paths.

Every source is capped at `max_upload_bytes` (413 beyond it) and image sources are fully
decoded once to refuse non-images and truncated files with a 400 before any work is queued.

`read_request_media` is the one media pass of a `/v1/videos` request: the api hands over the
request's flattened fields and its files once and gets back every conditioning image and video
read and checked (encoded bytes), or the first error:

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

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

from worldserve.errors import InvalidRequest, PayloadTooLarge
from worldserve.media.data_url import decode_data_url
from worldserve.media.fetch import FetchFailed, fetch_media, read_local
from worldserve.media.images import check_image
from worldserve.media.policy import MediaPolicy, check_upload_name, is_remote_url
from worldserve.media.video import check_video

READ_CHUNK = 1 << 20
FETCH_TIMEOUT_S = 10.0
FETCH_ATTEMPTS = 3
FETCH_BACKOFF_S = 0.2
VIDEO_EXTENSIONS = ("avi", "gif", "m4v", "mkv", "mov", "mp4", "mpeg", "mpg", "webm")
VIDEO_FILE_FIELDS = ("input_reference", "video_reference")
VIDEO_FIELDS = ("video_path", "video_url")
REFERENCE_FIELDS = ("input_reference", "reference_url")


def _too_large(field: str, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"{field}: upload is larger than the limit of {limit} bytes "
                           "(--max-upload-bytes)", param=field)


async def read_upload(upload: Any, field: str, limit: int) -> bytes:
    """Bytes of a Starlette UploadFile, refusing bad names and oversize files."""
    check_upload_name(upload.filename, field)
    size = getattr(upload, "size", None)
    if size is not None and size > limit:
        raise _too_large(field, limit)
    chunks, total = [], 0
    while chunk := await upload.read(READ_CHUNK):
        total += len(chunk)
        if total > limit:
            raise _too_large(field, limit)
        chunks.append(chunk)
    return b"".join(chunks)


def is_video_reference(value: str, content_type: str | None = None) -> bool:
    if content_type and content_type.startswith("video/"):
        return True
    lowered = value.lower()
    if lowered.startswith("data:video/"):
        return True
    return lowered.rsplit("?", 1)[0].rsplit(".", 1)[-1] in VIDEO_EXTENSIONS


async def _fetch(url: str, field: str, limit: int, policy: MediaPolicy,
                 kind: str = "image") -> bytes:
    """Download through worldserve's own fetcher (every redirect hop re-checked against the
    policy, non-public addresses refused), retrying 429 / 5xx / network errors (spec §2.3)."""
    hop_policy = dataclasses.replace(policy, max_bytes=limit, timeout_s=FETCH_TIMEOUT_S)
    for attempt in range(FETCH_ATTEMPTS):
        try:
            fetched = await fetch_media(url, hop_policy)
        except FetchFailed as exc:
            if not exc.retryable or attempt == FETCH_ATTEMPTS - 1:
                raise InvalidRequest(f"Failed to process {kind} source: {field}: {exc.message}",
                                     param=field) from None
            await asyncio.sleep(FETCH_BACKOFF_S * 2 ** attempt)
            continue
        except PayloadTooLarge:
            raise _too_large(field, limit) from None
        content_type = fetched.content_type
        if content_type and not content_type.startswith((f"{kind}/",
                                                         "application/octet-stream")):
            article = "an" if kind == "image" else "a"
            raise InvalidRequest(f"Failed to process {kind} source: {field} has content type "
                                 f"{content_type!r}, not {article} {kind}", param=field)
        return fetched.data
    raise InvalidRequest(f"Failed to process {kind} source: cannot download {field}", param=field)


async def _read_reference(value: str, field: str, limit: int, policy: MediaPolicy,
                          kind: str) -> tuple[str | None, bytes]:
    """(the data URL's mime type or None, the bytes) of a data URL, an http(s) URL or a local
    path that already passed the media policy, capped at `limit` (413 beyond it)."""
    if value.lower().startswith("data:"):
        if len(value) // 4 * 3 > limit + 1024:  # refuse before decoding anything
            raise _too_large(field, limit)
        mime, data = decode_data_url(value, field=field, base64_only=True)
        if len(data) > limit:
            raise _too_large(field, limit)
        return mime, data
    if is_remote_url(value):
        return None, await _fetch(value, field, limit, policy, kind=kind)
    try:
        return None, await read_local(Path(value), limit)
    except PayloadTooLarge:
        raise _too_large(field, limit) from None


def _video_not_supported(field: str) -> InvalidRequest:
    return InvalidRequest(f"{field}: video conditioning is not supported by this model",
                          param=field)


async def read_image_reference(value: str, field: str, limit: int, policy: MediaPolicy) -> bytes:
    """An image from a data URL, an http(s) URL or a local path (after the media policy)."""
    value = policy.check_reference(value, field)
    is_local = not value.lower().startswith("data:") and not is_remote_url(value)
    if is_local and is_video_reference(value):
        raise _video_not_supported(field)
    mime, data = await _read_reference(value, field, limit, policy, "image")
    if mime and mime.startswith("video/"):
        raise _video_not_supported(field)
    check_image(data, field)
    return data


async def read_video_reference(value: str, field: str, limit: int, policy: MediaPolicy) -> bytes:
    """A video file from a data URL, an http(s) URL or a local path (after the media policy);
    400 unless PyAV finds a video stream in it."""
    value = policy.check_reference(value, field)
    _mime, data = await _read_reference(value, field, limit, policy, "video")
    check_video(data, field)
    return data


# ---------------------------------------------------------------------- the one pass


@dataclasses.dataclass
class RequestMedia:
    """A request's conditioning media, read and checked (encoded files)."""

    images: list[bytes] = dataclasses.field(default_factory=list)
    videos: list[bytes] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
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
