"""Image decoding (uploads, data URLs) and encoding (PNG / JPEG / WebP) with Pillow."""

from __future__ import annotations

import io
import re

import numpy as np
from PIL import Image, UnidentifiedImageError

from worldserve.errors import InvalidRequest

IMAGE_FORMATS = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}
EXTENSIONS = {"png": "png", "jpeg": "jpg", "webp": "webp"}
CONTENT_TYPES = {
    "png": "image/png",
    "jpg": "image/jpeg",
    "jpeg": "image/jpeg",
    "webp": "image/webp",
}
# Refuse decompression bombs before decoding pixels (Pillow's own limit is ~89 Mpx).
# 4096 x 4096: a conditioning image is resized to the model's size anyway, and a small file that
# declares more pixels than this (a decompression bomb) is refused from its header alone.
MAX_INPUT_PIXELS = 4096 * 4096
_OBJECT_REPR = re.compile(r"<[\w.]+ object at 0x[0-9a-fA-F]+>")
_DATA_URL = re.compile(
    r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^;,]*)*?);base64,(?P<data>.*)$", re.DOTALL
)


def encode_image(frame: np.ndarray, output_format: str, quality: int = 75) -> bytes:
    """uint8 (H, W, 3) -> file bytes. PNG ignores `quality`."""
    if output_format not in IMAGE_FORMATS:
        raise InvalidRequest(
            f"output_format={output_format} is not supported", param="output_format"
        )
    buf = io.BytesIO()
    img = Image.fromarray(frame, mode="RGB")
    if output_format == "png":
        img.save(buf, "PNG")
    else:
        img.save(buf, IMAGE_FORMATS[output_format], quality=max(1, min(100, quality)))
    return buf.getvalue()


def decode_failure(exc: BaseException) -> str:
    """Why a decoder refused some bytes, fit for a client: no object reprs, addresses or errno
    (Pillow says `cannot identify image file <_io.BytesIO object at 0x...>`)."""
    if isinstance(exc, UnidentifiedImageError):
        return "not a recognised image format"
    strerror = getattr(exc, "strerror", None)  # FFmpeg errors: the reason without errno/path
    if isinstance(strerror, str) and strerror:
        return strerror
    text = _OBJECT_REPR.sub("the data", str(exc)).strip()
    return text or type(exc).__name__


def check_image(data: bytes, field: str = "image") -> tuple[int, int]:
    """Verify that `data` is a complete, decodable image; returns (width, height).

    Truncated files and non-images raise InvalidRequest naming `field`."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            width, height = img.size
            if width * height > MAX_INPUT_PIXELS:
                raise InvalidRequest(
                    f"{field}: image of {width}x{height} pixels is too large", param=field
                )
            img.load()  # decodes every pixel: catches truncated files
    except InvalidRequest:
        raise
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise InvalidRequest(f"Failed to process image source: {field} is not a readable image "
                             f"({decode_failure(exc)})", param=field) from None
    return width, height


def content_type_for(file_name: str) -> str:
    ext = file_name.rsplit(".", 1)[-1].lower()
    return CONTENT_TYPES.get(ext, "image/jpeg")
