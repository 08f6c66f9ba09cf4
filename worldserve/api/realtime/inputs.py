"""The `first_frame` of an init: bytes, a `data:` URL, or an http(s) URL (spec §3.1).

Local paths and file:// URLs are read only inside `--allowed-local-media-path` (refused
without it; docs/hostile-input.md). URLs are fetched with the shared media fetcher
(`worldserve.media.fetch`: allowlist and public-address checks on every redirect hop, bounded
bytes and time), and only when the server allows media domains (`allowed_media_domains`).
The image stays in memory and travels to the stage inside the chunk 0 request, so no
temporary file is written (nothing to delete at cleanup).
"""

from __future__ import annotations

from worldserve.errors import InvalidRequest, PayloadTooLarge
from worldserve.media.data_url import decode_data_url
from worldserve.media.fetch import MediaPolicy, fetch_remote, is_remote_url, load_media
from worldserve.media.images import check_image as check_decodable


def check_image(data: bytes, max_bytes: int) -> bytes:
    """Refuse anything that is not a complete, decodable image within the size limits (bytes,
    and pixels: a decompression bomb is refused from its header)."""
    if len(data) > max_bytes:
        raise InvalidRequest(f"first_frame has {len(data)} bytes; the limit is {max_bytes}",
                             param="first_frame")
    check_decodable(data, "first_frame")
    return data


async def _load(value: str, policy: MediaPolicy) -> bytes:
    if value[:5].lower() == "data:":
        return decode_data_url(value, field="first_frame", max_bytes=policy.max_bytes)[1]
    if is_remote_url(value):
        if not policy.allowed_domains:
            raise InvalidRequest("URLs are refused because the server allows no media domains "
                                 "(--allowed-media-domain); send the image bytes")
        return await fetch_remote(value, policy)
    # a local path or file:// URL: only inside --allowed-local-media-path (refused without it)
    return await load_media(value, policy, "first_frame")


async def resolve_first_frame(value: bytes | str | None, policy: MediaPolicy) -> bytes | None:
    """The image bytes, checked; raises InvalidRequest."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return check_image(value, policy.max_bytes)
    try:
        data = await _load(value, policy)
    except (InvalidRequest, PayloadTooLarge) as exc:
        raise InvalidRequest(f"first_frame: {exc.message}", param="first_frame") from None
    return check_image(data, policy.max_bytes)
