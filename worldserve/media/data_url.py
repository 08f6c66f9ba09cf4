"""`decode_data_url`: the one reader of `data:` URLs (RFC 2397), used by every surface.

Rules: `data:<mime>[;<param>...][;base64],<payload>`. A missing mime reads as
`application/octet-stream` (base64) or `text/plain` (percent-encoded, refused where
`base64_only`). An oversized payload is refused from its length, before decoding. Errors name
`field` (400 `invalid_request`, 413 past `max_bytes`).
"""

from __future__ import annotations

import base64
import binascii
from urllib.parse import unquote

from worldserve.errors import InvalidRequest, PayloadTooLarge


def decode_data_url(url: str, *, field: str = "url", max_bytes: int | None = None,
                    base64_only: bool = False) -> tuple[str, bytes]:
    """(mime, bytes) of a data URL; InvalidRequest names `field` and the expected shape."""
    header, sep, payload = url.partition(",")
    if not sep or not header.lower().startswith("data:"):
        raise InvalidRequest(f"{field}: malformed data URL: expected "
                             "'data:<mime>;base64,<payload>'", param=field)
    mime, _, params = header[5:].partition(";")
    is_base64 = "base64" in params.lower().split(";")
    if base64_only and not is_base64:
        raise InvalidRequest(f"{field}: data URLs must be base64: data:<mime>;base64,<payload>",
                             param=field)
    if max_bytes is not None and max(0, len(payload) * 3 // 4 - 2) > max_bytes:
        raise PayloadTooLarge(f"{field}: data URL payload exceeds the {max_bytes}-byte limit",
                              param=field)
    if not is_base64:
        return mime or "text/plain", unquote(payload).encode()
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"{field}: the data URL payload is not valid base64",
                             param=field) from None
    return mime or "application/octet-stream", data
