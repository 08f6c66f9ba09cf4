"""Seeded random test images, encoded."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image


def random_png(width: int, height: int, seed: int = 0) -> bytes:
    """A width x height PNG of uniform random RGB pixels from `seed`."""
    pixels = (np.random.RandomState(seed).rand(height, width, 3) * 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()
