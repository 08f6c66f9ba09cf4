"""Frame policy (spec section 5.1): JPEG or PNG by magic bytes, <= 8 MiB, <= 4 MP.

The pixel check reads only the image header (Pillow opens lazily); pixels are decoded by the
reasoner stage. Bodies are read with a byte limit that is enforced on `Content-Length` first and
then on the streamed count, so an oversized upload is refused without reading it.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import re
from typing import Any, AsyncIterator

from PIL import Image, UnidentifiedImageError
from starlette.requests import Request

from worldserve.errors import InvalidRequest, PayloadTooLarge, UnsupportedMediaType
from worldserve.media.frame_limits import MAX_FRAME_BYTES, check_frame_pixels, frame_too_large
from worldserve.media.images import decode_failure

# base64 of 8 MiB plus a JSON envelope (spec section 5.2)
MAX_JSON_FRAME_BYTES = 11_184_812 + 4096
MAX_B64_CHARS = 4 * ((MAX_FRAME_BYTES + 2) // 3)

_MAGIC = ((b"\xff\xd8\xff", "JPEG"), (b"\x89PNG\r\n\x1a\n", "PNG"))
_DATA_URL = re.compile(r"^data:([\w.+-]+/[\w.+-]+)?(;[\w=.+-]+)*;base64,", re.IGNORECASE)


def sniff_format(data: bytes) -> str | None:
    for magic, name in _MAGIC:
        if data.startswith(magic):
            return name
    return None


def check_frame(data: bytes) -> str:
    """Check size, type and pixel count of an encoded frame; return "JPEG" or "PNG"."""
    if len(data) > MAX_FRAME_BYTES:
        raise frame_too_large(len(data))
    if not data:
        raise InvalidRequest("empty frame; send one JPEG or PNG image")
    fmt = sniff_format(data)
    if fmt is None:
        raise InvalidRequest("unsupported image: frames must be JPEG or PNG (checked by their "
                             "magic bytes)")
    try:
        with Image.open(io.BytesIO(data), formats=[fmt]) as img:
            width, height = img.size
    except Image.DecompressionBombError as exc:
        raise PayloadTooLarge(f"frame too large: {exc}") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise InvalidRequest(f"invalid {fmt} image: {decode_failure(exc)}") from None
    check_frame_pixels(width, height)
    return fmt


def decode_b64_image(value: object, field: str = "image_b64") -> bytes:
    """Standard base64 (an optional `data:image/...;base64,` prefix is stripped) -> bytes."""
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"{field} is missing or empty; send the base64 of a JPEG or PNG file")
    match = _DATA_URL.match(value)
    text = value[match.end():] if match else value
    if len(text) > MAX_B64_CHARS:
        raise frame_too_large(len(text) * 3 // 4)
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidRequest(f"{field} is not valid base64: {exc}") from None
    if not data:
        raise InvalidRequest(f"{field} is missing or empty; send the base64 of a JPEG or PNG file")
    return data


def check_content_length(header: str | None, limit: int) -> None:
    if header is None:
        return
    try:
        declared = int(header)
    except ValueError:
        raise InvalidRequest(f"invalid Content-Length {header!r}") from None
    if declared > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds the limit of {limit} "
                              "bytes; a frame is at most 8 MiB (8388608 bytes)")


async def read_limited(chunks: AsyncIterator[bytes], limit: int) -> bytes:
    """Collect a streamed body, stopping with 413 as soon as it passes `limit`."""
    out = bytearray()
    async for chunk in chunks:
        out += chunk
        if len(out) > limit:
            raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes; a frame is "
                                  "at most 8 MiB (8388608 bytes)")
    return bytes(out)


def parse_json_object(data: str | bytes, what: str) -> dict[str, Any]:
    """A JSON object, else 400 naming `what` (a frame body, a WebSocket message)."""
    try:
        obj = json.loads(data)
    except ValueError as exc:
        raise InvalidRequest(f"{what} is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidRequest(f"{what} is nested too deeply") from None
    if not isinstance(obj, dict):
        raise InvalidRequest(f"{what} must be a JSON object")
    return obj


RAW_FRAME_TYPES = ("image/jpeg", "image/png", "application/octet-stream")


async def read_frame(request: Request) -> bytes:
    """The encoded frame of a REST frame request (spec section 5.2), checked (section 5.1)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json":
        check_content_length(request.headers.get("content-length"), MAX_JSON_FRAME_BYTES)
        body = await read_limited(request.stream(), MAX_JSON_FRAME_BYTES)
        image = decode_b64_image(parse_json_object(body, "frame body").get("image_b64"))
    elif content_type in RAW_FRAME_TYPES:
        check_content_length(request.headers.get("content-length"), MAX_FRAME_BYTES)
        image = await read_limited(request.stream(), MAX_FRAME_BYTES)
    else:
        raise UnsupportedMediaType(f"unsupported media type '{content_type}'; send "
                                   "application/json with image_b64, or image/jpeg or image/png")
    check_frame(image)
    return image
