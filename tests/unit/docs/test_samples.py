"""The sample inputs the docs' examples read (examples/) are small, decodable and what
examples/make_samples.py says they are."""

from __future__ import annotations

import sys

import av
from PIL import Image

from tests.support.server import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "examples"))
import make_samples  # noqa: E402

EXAMPLES = REPO_ROOT / "examples"


def test_the_frame_is_a_small_jpeg_of_the_declared_size() -> None:
    path = EXAMPLES / "frame.jpg"
    assert path.stat().st_size < 8 * 1024
    with Image.open(path) as image:
        assert (image.format, image.size) == ("JPEG", make_samples.FRAME_SIZE)
    assert path.read_bytes() == make_samples.frame_jpeg()  # the script made it


def test_the_clip_is_a_small_h264_mp4_of_the_declared_length() -> None:
    path = EXAMPLES / "clip.mp4"
    assert path.stat().st_size < 8 * 1024
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(stream)]
        assert stream.codec_context.name == "h264"
    assert len(frames) == make_samples.CLIP_FRAMES
    assert frames[0].shape == (make_samples.CLIP_SIZE[1], make_samples.CLIP_SIZE[0], 3)
