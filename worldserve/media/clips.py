"""A video sampled into a clip of frames for the reasoner (chat `video_url` parts).

vLLM's rule for `media_io_kwargs.video.fps`: a clip of `total` frames at `rate` frames a second
gives `max(1, int(total / rate * fps))` frames, at the indices `linspace(0, total - 1, n)` (the
first and the last frame always in). worldserve caps a clip at `max_frames` and reports the rate
the frames were actually taken at, which the model's video positions use. Each sampled frame is
encoded as PNG (lossless: the stage sees exactly the decoded pixels). Only the sampled frames are
kept while decoding, so a long video costs decode time, not memory.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import av
import numpy as np

from worldserve.errors import InvalidRequest, WorldserveError
from worldserve.media.frame_limits import check_frame_pixels
from worldserve.media.images import encode_image

DEFAULT_CLIP_FPS = 2.0  # Qwen-VL video processors' default sampling rate
MAX_CLIP_FRAMES = 64


@dataclass(frozen=True)
class Clip:
    frames: list[bytes]  # PNG files, in time order
    fps: float  # the rate the frames were taken at


def sample_indices(total: int, rate: float | None, fps: float, max_frames: int) -> list[int]:
    """The frame indices vLLM samples at `fps` from `total` frames shown `rate` a second."""
    wanted = int(total / rate * fps) if rate else total
    count = max(1, min(wanted, total, max_frames))
    return sorted({int(i) for i in np.linspace(0, total - 1, count)})


def sample_clip(data: bytes, fps: float, max_frames: int = MAX_CLIP_FRAMES,
                field: str = "video_url") -> Clip:
    """`data` (a video file) sampled at `fps` frames a second, at most `max_frames` frames;
    400 naming `field` when it holds no readable video, 413 for frames above 4 MP."""
    try:
        total, rate = _count_frames(data)
        if total == 0:
            raise InvalidRequest(f"{field}: the video has no frames", param=field)
        picks = sample_indices(total, rate, fps, max_frames)
        frames = _decode_at(data, set(picks))
    except WorldserveError:
        raise
    except Exception as exc:  # PyAV raises assorted errors for bad bytes
        raise InvalidRequest(f"{field} is not a readable video ({type(exc).__name__})",
                             param=field) from None
    taken = len(frames) / (total / rate) if rate else fps
    return Clip([encode_image(f, "png") for f in frames], round(taken, 6))


def _count_frames(data: bytes) -> tuple[int, float | None]:
    """(frames, frames a second) of the first video stream, from its packets (no decoding)."""
    with av.open(io.BytesIO(data)) as container:
        if not container.streams.video:
            raise InvalidRequest("the video has no video stream", param="video_url")
        stream = container.streams.video[0]
        rate = stream.average_rate or stream.guessed_rate
        total = sum(1 for packet in container.demux(stream) if packet.size)
    return total, float(rate) if rate else None


def _decode_at(data: bytes, picks: set[int]) -> list[np.ndarray]:
    """The RGB frames at `picks` (decode order = display order for one video stream)."""
    out: list[np.ndarray] = []
    with av.open(io.BytesIO(data)) as container:
        for index, frame in enumerate(container.decode(video=0)):
            if index in picks:
                check_frame_pixels(frame.width, frame.height)
                out.append(frame.to_ndarray(format="rgb24"))
            if len(out) == len(picks):
                break
    return out
