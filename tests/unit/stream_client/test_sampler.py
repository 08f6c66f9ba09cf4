"""Sampler: step math, 4 MP downscale, JPEG encoding and looping over a synthetic MP4."""

from __future__ import annotations

import io
import time
from pathlib import Path

import av
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from tests.unit.stream_client.synthetic import write_clip
from worldserve.clients.streaming import (
    JPEG_QUALITY,
    MAX_FRAME_PIXELS,
    StreamError,
    fit_within_pixels,
    iter_frames,
    sample_step,
)


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_clip(tmp_path_factory.mktemp("clip") / "clip.mp4", num_frames=30, fps=10)


@pytest.mark.parametrize(
    ("source_fps", "fps", "step"),
    [
        (30.0, 1.0, 30),
        (10.0, 2.0, 5),
        (25.0, 2.0, 12),  # 12.5 rounds half to even
        (27.0, 2.0, 14),
        (10.0, 20.0, 1),
        (29.97, 1.0, 30),
        (None, 1.0, 30),
        (0.0, 3.0, 10),
    ],
)
def test_sample_step(source_fps: float | None, fps: float, step: int) -> None:
    assert sample_step(source_fps, fps) == step


@pytest.mark.parametrize("size", [(1920, 1080), (2048, 2048), (64, 48)])
def test_frames_within_4mp_are_untouched(size: tuple[int, int]) -> None:
    image = Image.new("RGB", size)
    assert fit_within_pixels(image) is image


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9000), st.integers(1, 9000))
def test_downscale_stays_within_4mp_and_keeps_aspect(width: int, height: int) -> None:
    image = Image.new("L", (width, height))
    out = fit_within_pixels(image)
    assert out.size[0] * out.size[1] <= MAX_FRAME_PIXELS
    if width * height > MAX_FRAME_PIXELS:
        assert out.size[0] <= width and out.size[1] <= height
        assert (
            abs(out.size[0] / out.size[1] - width / height)
            <= 0.02 * width / height + 1 / out.size[1]
        )
        # no needless shrinking: at most a couple of rows/columns below the bound
        assert (out.size[0] + 2) * (out.size[1] + 2) > MAX_FRAME_PIXELS


def test_step_keeps_every_nth_frame_as_jpeg_quality_85(clip: Path) -> None:
    frames = list(iter_frames(str(clip), fps=2.0, max_frames=100))
    assert len(frames) == 6  # 30 frames at 10 fps, step 5
    with av.open(str(clip)) as container:
        decoded = [f.to_image() for f in container.decode(video=0)]
    for kept, source in zip(frames, decoded[::5]):
        expected = io.BytesIO()
        source.convert("RGB").save(expected, format="JPEG", quality=JPEG_QUALITY)
        assert kept == expected.getvalue()
        assert Image.open(io.BytesIO(kept)).format == "JPEG"


def test_max_frames_and_loop(clip: Path) -> None:
    assert len(list(iter_frames(str(clip), fps=2.0, max_frames=4))) == 4
    assert len(list(iter_frames(str(clip), fps=2.0, max_frames=20))) == 6
    looped = list(iter_frames(str(clip), fps=2.0, max_frames=20, loop=True))
    assert len(looped) == 20
    assert looped[6:12] == looped[:6]  # each pass replays the clip from the start


def test_large_frames_are_downscaled_to_4mp(tmp_path: Path) -> None:
    big = write_clip(tmp_path / "big.mp4", num_frames=2, fps=1, width=2800, height=1600)
    (frame,) = iter_frames(str(big), fps=1.0, max_frames=1)
    width, height = Image.open(io.BytesIO(frame)).size
    assert width * height <= MAX_FRAME_PIXELS
    assert abs(width / height - 2800 / 1600) < 0.01


def test_realtime_paces_frames_by_their_source_interval(clip: Path) -> None:
    started = time.monotonic()
    frames = list(iter_frames(str(clip), fps=10.0, max_frames=4, realtime=True))
    assert len(frames) == 4
    assert time.monotonic() - started >= 0.3 - 0.01  # 3 gaps of 1/10 s; never faster


def test_undecodable_input_is_a_stream_error(tmp_path: Path) -> None:
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"not a video at all" * 10)
    with pytest.raises(StreamError, match="cannot decode"):
        list(iter_frames(str(junk), fps=1.0, max_frames=3))
