"""The `first_frame` of an init: bytes, a `data:` URL, or an http(s) URL (spec §3.1).

Plain server paths are refused. URLs are fetched only when the server allows media domains
(`allowed_media_domains`); the allowlist is checked on every redirect hop (at most 5) and
the download is capped. The image stays in memory and travels to the stage inside the chunk
0 request, so no temporary file is written (nothing to delete at cleanup).
"""

from __future__ import annotations

import base64
import binascii
import io
from urllib.parse import urljoin, urlsplit

import httpx
from PIL import Image, UnidentifiedImageError

from worldserve.errors import InvalidRequest

MAX_FIRST_FRAME_BYTES = 32 * 1024 * 1024
MAX_REDIRECT_HOPS = 5
FETCH_TIMEOUT_S = 20.0


def check_image(data: bytes) -> bytes:
    """Refuse anything that is not a decodable image of sane size."""
    if len(data) > MAX_FIRST_FRAME_BYTES:
        raise InvalidRequest(f"first_frame has {len(data)} bytes; the limit is "
                             f"{MAX_FIRST_FRAME_BYTES}", param="first_frame")
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.verify()
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise InvalidRequest(f"first_frame is not a decodable image: {exc}",
                             param="first_frame") from None
    return data


def decode_data_url(url: str) -> bytes:
    header, sep, body = url.partition(",")
    if not sep or not header.endswith(";base64"):
        raise InvalidRequest("first_frame: data URLs must be 'data:<mime>;base64,<data>'",
                             param="first_frame")
    try:
        return base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest("first_frame: the data URL is not valid base64",
                             param="first_frame") from None


def _host_allowed(url: str, domains: list[str]) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    return any(host == d or host.endswith("." + d) for d in domains)


async def fetch_url(url: str, domains: list[str]) -> bytes:
    """GET with the allowlist checked on every hop and a size cap."""
    async with httpx.AsyncClient(follow_redirects=False, timeout=FETCH_TIMEOUT_S) as client:
        for _ in range(MAX_REDIRECT_HOPS + 1):
            if urlsplit(url).scheme not in ("http", "https") or not _host_allowed(url, domains):
                raise InvalidRequest(f"first_frame: {url!r} is not on an allowed media domain",
                                     param="first_frame")
            async with client.stream("GET", url) as resp:
                if resp.is_redirect:
                    url = urljoin(url, resp.headers.get("location", ""))
                    continue
                if resp.status_code != 200:
                    raise InvalidRequest(f"first_frame: GET {url} answered {resp.status_code}",
                                         param="first_frame")
                data = bytearray()
                async for part in resp.aiter_bytes():
                    data += part
                    if len(data) > MAX_FIRST_FRAME_BYTES:
                        raise InvalidRequest("first_frame: the download exceeds "
                                             f"{MAX_FIRST_FRAME_BYTES} bytes", param="first_frame")
                return bytes(data)
    raise InvalidRequest(f"first_frame: more than {MAX_REDIRECT_HOPS} redirects",
                         param="first_frame")


async def resolve_first_frame(value: bytes | str | None, domains: list[str]) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return check_image(value)
    if value.startswith("data:"):
        return check_image(decode_data_url(value))
    if value.startswith(("http://", "https://")):
        if not domains:
            raise InvalidRequest("first_frame: URLs are refused because the server allows no "
                                 "media domains (--allowed-media-domain); send the image bytes",
                                 param="first_frame")
        try:
            return check_image(await fetch_url(value, domains))
        except httpx.HTTPError as exc:
            raise InvalidRequest(f"first_frame: cannot fetch {value!r}: {exc}",
                                 param="first_frame") from None
    raise InvalidRequest("first_frame: server paths are refused; send bytes, a data: URL or "
                         "an http(s) URL", param="first_frame")
