"""Synthetic H.264 clips written with PyAV, so tests never depend on an asset file."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np


def write_clip(path: Path, num_frames: int = 30, fps: int = 10, width: int = 64,
               height: int = 48) -> Path:
    """An MP4 whose frame i is a flat grey level 8*i (so frames are distinguishable)."""
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps, 1))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast"}
        for index in range(num_frames):
            pixels = np.full((height, width, 3), (8 * index) % 256, dtype=np.uint8)
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path
