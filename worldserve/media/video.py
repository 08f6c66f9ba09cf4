"""H.264 MP4 encoding and decoding with PyAV (cpu-stack notes §10)."""

from __future__ import annotations

import io
from pathlib import Path

import av
import numpy as np


def compression_to_crf(compression: int) -> int:
    """Compression level 0..100 (higher = better quality) -> x264 CRF 45..10."""
    compression = max(0, min(100, compression))
    return round(45 - 35 * compression / 100)


def encode_mp4(
    frames: np.ndarray, fps: int, target: Path | io.BytesIO, compression: int = 50
) -> None:
    """uint8 frames (T, H, W, 3) -> H.264 (yuv420p) MP4 written to `target`."""
    height, width = frames.shape[1:3]
    with av.open(
        target if isinstance(target, io.BytesIO) else str(target), mode="w", format="mp4"
    ) as container:
        stream = container.add_stream("libx264", rate=max(1, fps))
        stream.width, stream.height = width - width % 2, height - height % 2
        stream.pix_fmt = "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": str(compression_to_crf(compression))}
        for frame in frames:
            image = av.VideoFrame.from_ndarray(
                np.ascontiguousarray(frame[: stream.height, : stream.width]), format="rgb24"
            )
            for packet in stream.encode(image):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def decode_frames(data: bytes) -> list[np.ndarray]:
    """Every frame of a video file as uint8 RGB arrays."""
    with av.open(io.BytesIO(data)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
