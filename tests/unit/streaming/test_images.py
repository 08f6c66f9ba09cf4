"""Frame policy (spec section 5.1): magic bytes, header-only pixel check, byte limits."""

from __future__ import annotations

import base64
import io
import struct
import zlib

import pytest
from PIL import Image

from worldserve.api.streaming.images import (
    MAX_FRAME_BYTES,
    check_content_length,
    check_frame,
    decode_b64_image,
    read_limited,
)
from worldserve.errors import InvalidRequest, PayloadTooLarge


def encode(fmt: str, size: tuple[int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size).save(out, format=fmt)
    return out.getvalue()


def _chunk(kind: bytes, payload: bytes) -> bytes:
    crc = struct.pack(">I", zlib.crc32(kind + payload))
    return struct.pack(">I", len(payload)) + kind + payload + crc


def png_header_only(width: int, height: int) -> bytes:
    """A PNG claiming `width x height` whose (empty) IDAT holds no pixel data at all."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", b"")


def test_jpeg_and_png_are_recognised_by_magic_bytes() -> None:
    assert check_frame(encode("JPEG", (8, 8))) == "JPEG"
    assert check_frame(encode("PNG", (8, 8))) == "PNG"


@pytest.mark.parametrize("data", [encode("GIF", (8, 8)), encode("BMP", (8, 8)), b"RIFF....WEBP",
                                  b"\x00\x00\x00\x18ftypmp42"])
def test_other_formats_are_400(data: bytes) -> None:
    with pytest.raises(InvalidRequest, match="JPEG or PNG"):
        check_frame(data)


def test_pixel_limit_reads_only_the_header() -> None:
    # 3840x2160 is 8.3 MP: refused although the "file" holds no pixels
    with pytest.raises(PayloadTooLarge, match="3840x2160 = 8294400 pixels"):
        check_frame(png_header_only(3840, 2160))
    assert check_frame(png_header_only(2048, 2048)) == "PNG"  # exactly 4 MP passes the header check


def test_huge_dimensions_are_413_not_a_decompression_error() -> None:
    with pytest.raises(PayloadTooLarge):
        check_frame(png_header_only(60000, 60000))


def test_byte_limit() -> None:
    with pytest.raises(PayloadTooLarge, match="8388609 bytes"):
        check_frame(b"\xff\xd8\xff" + bytes(MAX_FRAME_BYTES - 2))
    with pytest.raises(InvalidRequest, match="empty"):
        check_frame(b"")


def test_base64_with_and_without_data_url_prefix() -> None:
    raw = encode("PNG", (4, 4))
    text = base64.b64encode(raw).decode()
    assert decode_b64_image(text) == raw
    assert decode_b64_image("data:image/png;base64," + text) == raw
    for bad in ("", None, 5, "ab cd", "abc"):
        with pytest.raises(InvalidRequest):
            decode_b64_image(bad)


def test_content_length_checked_before_reading() -> None:
    check_content_length(None, 10)
    check_content_length("10", 10)
    with pytest.raises(PayloadTooLarge):
        check_content_length("11", 10)
    with pytest.raises(InvalidRequest):
        check_content_length("ten", 10)


async def test_streamed_count_stops_at_the_limit() -> None:
    pulled = []

    async def chunks():
        for i in range(100):
            pulled.append(i)
            yield b"x" * 4

    with pytest.raises(PayloadTooLarge):
        await read_limited(chunks(), 10)
    assert len(pulled) == 3  # stopped as soon as the count passed the limit
    assert await read_limited(_once(b"abc"), 10) == b"abc"


async def _once(data: bytes):
    yield data
