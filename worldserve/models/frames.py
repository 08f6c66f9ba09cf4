"""Pixels in and out of the world-model families: the session's first frame from its encoded
bytes, and the pipelines' float frames as uint8 (numpy and Pillow only)."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, UnidentifiedImageError

from worldserve.errors import InvalidRequest


def decode_first_frame(data: bytes) -> Image.Image:
    """An init's `first_frame` as an RGB image; InvalidRequest when it does not decode."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            return img.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise InvalidRequest(f"first_frame is not a decodable image: {exc}") from None


def to_uint8(frames: np.ndarray) -> np.ndarray:
    """[0, 1] float frames -> uint8, rounded like the pipelines' own "pil" output."""
    return (np.clip(frames, 0.0, 1.0) * 255.0).round().astype(np.uint8)
