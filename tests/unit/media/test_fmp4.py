"""The fragmented-MP4 writer: one fragment per chunk, holding exactly that chunk's frames."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

from worldserve.media.fmp4 import FragmentedMP4Writer, init_segment, iter_boxes


def chunk(index: int, num_frames: int = 6, width: int = 64, height: int = 48) -> np.ndarray:
    frames = np.zeros((num_frames, height, width, 3), np.uint8)
    for i in range(num_frames):
        frames[i, ..., 0] = 40 * index + 5 * i
        frames[i, ..., 2] = 200
    return frames


def decode(data: bytes) -> tuple[list[np.ndarray], av.video.stream.VideoStream]:
    container = av.open(io.BytesIO(data))
    frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    return frames, container.streams.video[0]


def test_each_chunk_is_one_fragment_of_exactly_its_frames():
    writer = FragmentedMP4Writer(64, 48, fps=10)
    chunks = [writer.write(chunk(k)) for k in range(3)]
    writer.close()
    assert [kind for kind, _, _ in iter_boxes(chunks[0])] == [b"ftyp", b"moov", b"moof", b"mdat"]
    assert all([kind for kind, _, _ in iter_boxes(c)] == [b"moof", b"mdat"] for c in chunks[1:])
    init = init_segment(chunks[0])
    for k, data in enumerate(chunks):
        frames, stream = decode(data if k == 0 else init + data)
        assert len(frames) == 6 and (stream.width, stream.height) == (64, 48)
        assert float(stream.average_rate) == 10
        red = [int(f[..., 0].mean()) for f in frames]
        assert red == pytest.approx([40 * k + 5 * i for i in range(6)], abs=3)
    frames, _ = decode(b"".join(chunks))
    assert len(frames) == 18


def test_write_after_close_is_refused():
    writer = FragmentedMP4Writer(32, 32, fps=8)
    writer.close()
    writer.close()
    with pytest.raises(RuntimeError):
        writer.write(chunk(0, width=32, height=32))
