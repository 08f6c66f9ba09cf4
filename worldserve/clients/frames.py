"""Frame sampling for `worldserve stream`: PyAV decode, every `step`-th frame, JPEG bytes."""

from __future__ import annotations

import io
import math
import time
from typing import Iterator

import av
from PIL import Image

from worldserve.clients.stream_common import (
    DEFAULT_SOURCE_FPS,
    JPEG_QUALITY,
    MAX_FRAME_PIXELS,
    StreamError,
)


def sample_step(source_fps: float | None, fps: float) -> int:
    """Keep every `step`-th decoded frame: max(1, round(source_fps / fps)), halves to even."""
    rate = source_fps if source_fps and source_fps > 0 else DEFAULT_SOURCE_FPS
    return max(1, round(rate / fps))


def fit_within_pixels(image: Image.Image, max_pixels: int = MAX_FRAME_PIXELS) -> Image.Image:
    """Downscale (aspect ratio kept) so that width × height <= max_pixels."""
    width, height = image.size
    if width * height <= max_pixels:
        return image
    scale = math.sqrt(max_pixels / (width * height))
    new_w, new_h = max(1, int(width * scale)), max(1, int(height * scale))
    while new_w * new_h > max_pixels:  # int() rounding can still overshoot by a row
        new_h -= 1
    return image.resize((new_w, new_h), Image.Resampling.BILINEAR)


def encode_jpeg(image: Image.Image, quality: int = JPEG_QUALITY) -> bytes:
    buf = io.BytesIO()
    fit_within_pixels(image.convert("RGB")).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def _one_pass(video: str, fps: float, input_format: str | None) -> Iterator[tuple[bytes, float]]:
    """One decode of the source: (jpeg, seconds between kept frames) for every kept frame."""
    with av.open(video, format=input_format) as container:
        stream = container.streams.video[0]
        source_fps = float(stream.average_rate) if stream.average_rate else None
        step = sample_step(source_fps, fps)
        interval_s = step / (source_fps or DEFAULT_SOURCE_FPS)
        for index, frame in enumerate(container.decode(stream)):
            if index % step == 0:
                yield encode_jpeg(frame.to_image()), interval_s


def iter_frames(video: str, fps: float, max_frames: int, loop: bool = False,
                input_format: str | None = None, realtime: bool = False) -> Iterator[bytes]:
    """JPEG frames sampled at `fps`, at most `max_frames`; `loop` replays the source.

    Without `realtime` frames come as fast as they decode (the caller waits for each reply);
    with it, kept frames are spaced by their source interval in wall-clock time.
    """
    count, next_at = 0, time.monotonic()
    while count < max_frames:
        produced = 0
        try:
            for jpeg, interval_s in _one_pass(video, fps, input_format):
                if realtime:
                    time.sleep(max(0.0, next_at - time.monotonic()))
                    next_at = max(next_at, time.monotonic() - interval_s) + interval_s
                produced += 1
                count += 1
                yield jpeg
                if count >= max_frames:
                    return
        except (av.FFmpegError, IndexError) as exc:
            raise StreamError(f"cannot decode {video}: {exc}") from exc
        if produced == 0:
            raise StreamError(f"No frames decoded from {video}")
        if not loop:
            return
