"""Reading request media into bytes: multipart uploads, data URLs, http(s) URLs, local paths.

Every source is capped at `max_upload_bytes` (413 beyond it) and image sources are fully
decoded once to refuse non-images and truncated files with a 400 before any work is queued.
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

READ_CHUNK = 1 << 20
FETCH_TIMEOUT_S = 10.0
FETCH_ATTEMPTS = 3
FETCH_BACKOFF_S = 0.2
VIDEO_EXTENSIONS = ("avi", "gif", "m4v", "mkv", "mov", "mp4", "mpeg", "mpg", "webm")


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
    from worldserve.media.video import check_video

    value = policy.check_reference(value, field)
    _mime, data = await _read_reference(value, field, limit, policy, "video")
    check_video(data, field)
    return data
