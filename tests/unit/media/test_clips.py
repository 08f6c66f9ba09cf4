"""A chat video sampled into a clip (vLLM's `media_io_kwargs.video.fps` rule): the frames are
the decoded frames at the rule's indices, pixel for pixel (PNG), against an independent decode."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from worldserve.errors import InvalidRequest
from worldserve.media.clips import sample_clip, sample_indices
from worldserve.media.video import decode_frames, encode_mp4


def clip_bytes(num_frames: int = 24, fps: int = 12) -> bytes:
    frames = np.zeros((num_frames, 32, 48, 3), np.uint8)
    for i in range(num_frames):
        frames[i] = ((i * 37) % 256, (i * 91) % 256, (i * 53) % 256)
    out = io.BytesIO()
    encode_mp4(frames, fps, out, compression=90)
    return out.getvalue()


def test_the_sampled_frames_are_the_decoded_frames_at_vllms_indices() -> None:
    data = clip_bytes()
    decoded = decode_frames(data)
    clip = sample_clip(data, fps=4.0)
    indices = [int(i) for i in np.linspace(0, 23, 8)]  # int(24 / 12 * 4) = 8 frames
    assert len(clip.frames) == 8 and clip.fps == pytest.approx(4.0)
    for png, index in zip(clip.frames, indices):
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(png)).convert("RGB")),
                              decoded[index])


def test_caps_and_rates() -> None:
    assert sample_indices(24, 12.0, 100.0, 64) == list(range(24))  # never more than there are
    assert sample_indices(24, 12.0, 0.1, 64) == [0]  # at least one
    capped = sample_clip(clip_bytes(), fps=12.0, max_frames=6)
    assert len(capped.frames) == 6 and capped.fps == pytest.approx(3.0)  # 6 frames over 2 s


def test_not_a_video_is_a_400() -> None:
    with pytest.raises(InvalidRequest, match="video_url is not a readable video"):
        sample_clip(b"not a video at all", fps=2.0)
