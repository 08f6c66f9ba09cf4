"""Reading request media into bytes: multipart uploads, data URLs, http(s) URLs, local paths.

Every source is capped at `max_upload_bytes` (413 beyond it) and image sources are fully
decoded once to refuse non-images and truncated files with a 400 before any work is queued.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from worldserve.errors import InvalidRequest, PayloadTooLarge
from worldserve.media.images import check_image, decode_data_url
from worldserve.media.policy import MediaPolicy, check_upload_name

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


async def _fetch(url: str, field: str, limit: int) -> bytes:
    last: str = "no attempt"
    async with httpx.AsyncClient(timeout=FETCH_TIMEOUT_S, follow_redirects=True) as client:
        for attempt in range(FETCH_ATTEMPTS):
            try:
                async with client.stream("GET", url) as resp:
                    if resp.status_code == 429 or resp.status_code >= 500:
                        last = f"HTTP {resp.status_code}"
                    elif resp.status_code >= 400:
                        raise InvalidRequest(f"Failed to process image source: {field} answered "
                                             f"HTTP {resp.status_code}", param=field)
                    else:
                        kind = resp.headers.get("content-type", "")
                        if kind and not kind.startswith(("image/", "application/octet-stream")):
                            raise InvalidRequest(f"Failed to process image source: {field} has "
                                                 f"content type {kind!r}, not an image", param=field)
                        data = bytearray()
                        async for chunk in resp.aiter_bytes():
                            data += chunk
                            if len(data) > limit:
                                raise _too_large(field, limit)
                        return bytes(data)
            except httpx.HTTPError as exc:
                last = type(exc).__name__
            await asyncio.sleep(FETCH_BACKOFF_S * 2 ** attempt)
    raise InvalidRequest(f"Failed to process image source: cannot download {field} ({last})",
                         param=field)


async def read_image_reference(value: str, field: str, limit: int, policy: MediaPolicy) -> bytes:
    """An image from a data URL, an http(s) URL or a local path (after the media policy)."""
    value = policy.check_reference(value, field)
    if value.lower().startswith("data:"):
        mime, data = decode_data_url(value, field)
        if len(data) > limit:
            raise _too_large(field, limit)
        if mime and mime.startswith("video/"):
            raise InvalidRequest(f"{field}: video conditioning is not supported by this model",
                                 param=field)
    elif value.lower().startswith(("http://", "https://")):
        data = await _fetch(value, field, limit)
    else:
        if is_video_reference(value):
            raise InvalidRequest(f"{field}: video conditioning is not supported by this model",
                                 param=field)
        data = _read_local(value, field, limit)
    check_image(data, field)
    return data


def _read_local(value: str, field: str, limit: int) -> bytes:
    path = Path(value).expanduser()
    try:
        if path.stat().st_size > limit:
            raise _too_large(field, limit)
        return path.read_bytes()
    except OSError as exc:
        raise InvalidRequest(f"Failed to process image source: cannot read {field} "
                             f"({exc.strerror})", param=field) from None
