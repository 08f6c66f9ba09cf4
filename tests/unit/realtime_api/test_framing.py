"""Realtime framing: batching, split rule, delta codecs, previews, reference rule (spec §4-5)."""

from __future__ import annotations

import gzip
import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from worldserve.media.framing import (
    INLINE_PAYLOAD_LIMIT,
    ChunkEncoder,
    EncodeSettings,
    FrameDecoder,
    FramingError,
    batch_bounds,
    delta_decode,
    delta_encode,
    frame_messages,
    preview_size,
    unpack,
)


def moving_frames(n: int, h: int = 24, w: int = 40, start: int = 0) -> np.ndarray:
    xs = np.arange(w)[None, :]
    ys = np.arange(h)[:, None]
    out = np.empty((n, h, w, 3), np.uint8)
    for i in range(n):
        out[i, :, :, 0] = (xs + start + i) % 256
        out[i, :, :, 1] = (ys * 3) % 256
        out[i, :, :, 2] = (xs * ys + i) % 256
    return out


def spec_delta_encode(frames, reference=None, level=1):
    """The reference implementation printed in spec §5.2."""
    import zlib

    prev = None if reference is None else np.frombuffer(reference, np.uint8)
    out = zlib.compressobj(level=level, wbits=31)
    parts = []
    for f in frames:
        cur = np.frombuffer(f, np.uint8)
        parts.append(out.compress(f if prev is None else (cur ^ prev).tobytes()))
        prev = cur
    parts.append(out.flush())
    return b"".join(parts)


@pytest.mark.parametrize("fmt,n,expected", [
    ("raw", 12, [(0, 12)]), ("raw", 24, [(0, 16), (16, 24)]),
    ("delta-zstd", 33, [(0, 16), (16, 32), (32, 33)]),
    ("webp", 24, [(0, 6), (6, 12), (12, 18), (18, 24)]), ("jpeg", 9, [(0, 6), (6, 9)]),
])
def test_batch_bounds(fmt, n, expected):
    assert batch_bounds(n, fmt) == expected


def test_split_rule_exactly_at_64_kib():
    header = {"chunk_index": 0, "num_frames": 1}
    single = frame_messages(header, b"\1" * (INLINE_PAYLOAD_LIMIT - 1))
    assert len(single) == 1
    msg = unpack(single[0])
    assert msg["type"] == "frame_batch" and len(msg["payload"]) == 65_535
    split = frame_messages(header, b"\1" * INLINE_PAYLOAD_LIMIT)
    assert len(split) == 2
    assert unpack(split[0])["type"] == "frame_batch_header"
    assert "payload" not in unpack(split[0])
    assert split[1] == b"\1" * 65_536


@pytest.mark.parametrize("encoding", ["delta-gzip", "delta-zstd"])
@pytest.mark.parametrize("with_reference", [False, True])
def test_delta_round_trip(encoding, with_reference):
    frames = moving_frames(7)
    reference = moving_frames(1, start=99)[0] if with_reference else None
    payload = delta_encode(frames, encoding, 3, reference)
    decoded = delta_decode(payload, encoding, frames.shape, reference)
    assert np.array_equal(decoded, frames)


def test_delta_gzip_matches_spec_reference_and_standard_gzip():
    frames = moving_frames(5)
    reference = moving_frames(1, start=7)[0]
    ours = delta_encode(frames, "delta-gzip", 1, reference)
    spec = spec_delta_encode([f.tobytes() for f in frames], reference.tobytes(), level=1)
    assert gzip.decompress(ours) == gzip.decompress(spec)


def test_level_0_payload_decodes_with_any_gzip_decoder():
    frames = moving_frames(3)
    payload = delta_encode(frames, "delta-gzip", 0)
    residuals = np.frombuffer(gzip.decompress(payload), np.uint8).reshape(frames.shape)
    assert np.array_equal(np.bitwise_xor.accumulate(residuals, axis=0), frames)
    assert len(payload) > frames.nbytes  # stored blocks: level 0 never shrinks


def test_delta_decode_rejects_wrong_size():
    frames = moving_frames(2)
    payload = delta_encode(frames, "delta-zstd", 3)
    with pytest.raises(FramingError):
        delta_decode(payload, "delta-zstd", (3, *frames.shape[1:]))


@settings(max_examples=40, deadline=None)
@given(data=st.data(), n=st.integers(1, 5), h=st.integers(1, 6), w=st.integers(1, 6),
       encoding=st.sampled_from(["delta-gzip", "delta-zstd"]), use_ref=st.booleans())
def test_delta_round_trip_property(data, n, h, w, encoding, use_ref):
    raw = data.draw(st.binary(min_size=n * h * w * 3, max_size=n * h * w * 3))
    frames = np.frombuffer(raw, np.uint8).reshape(n, h, w, 3)
    ref = None
    if use_ref:
        ref = np.frombuffer(data.draw(st.binary(min_size=h * w * 3, max_size=h * w * 3)),
                            np.uint8).reshape(h, w, 3)
    level = 0 if encoding == "delta-gzip" else 1
    assert np.array_equal(delta_decode(delta_encode(frames, encoding, level, ref), encoding,
                                       frames.shape, ref), frames)


def encode_session(fmt, chunks, event_ids, shapes=None):
    encoder = ChunkEncoder(EncodeSettings(fmt=fmt))
    out = []
    for index, (frames, event_id) in enumerate(zip(chunks, event_ids)):
        out.append(encoder.encode_chunk(frames, request_id=f"r{index}", chunk_index=index,
                                        event_id=event_id))
    return out


@pytest.mark.parametrize("fmt", ["delta-gzip", "delta-zstd"])
def test_reference_rule_across_chunks_and_events(fmt):
    chunks = [moving_frames(20, start=0), moving_frames(12, start=20), moving_frames(12, start=32),
              moving_frames(12, h=16, start=44)]
    encoded = encode_session(fmt, chunks, [None, None, 5, 5])
    refs = [[b.header.get("delta_reference") for b in batches] for batches in encoded]
    # chunk 0 never references; same event -> reference; event change -> none; size change -> none
    assert refs == [[None, None], ["previous-frame"], [None], [None]]
    assert encoded[1][0].header["compression_level"] == (1 if fmt == "delta-gzip" else 3)
    decoder = FrameDecoder()
    for frames, batches in zip(chunks, encoded):
        got = np.concatenate([decoder.decode(b.header, b.payload) for b in batches])
        assert np.array_equal(got, frames)


def test_decoder_refuses_reference_it_does_not_have():
    chunks = [moving_frames(4), moving_frames(4, start=4)]
    encoded = encode_session("delta-zstd", chunks, [None, None])
    with pytest.raises(FramingError):
        FrameDecoder().decode(encoded[1][0].header, encoded[1][0].payload)


def test_raw_headers_have_every_spec_key():
    frames = moving_frames(12)
    [batch] = encode_session("raw", [frames], [3])[0]
    h = batch.header
    assert h["content_type"] == "application/x-raw-rgb" and h["format"] == "rgb24"
    assert h["bytes_per_frame"] == 24 * 40 * 3 and h["raw_size"] == 12 * 24 * 40 * 3
    assert h["total_size"] == len(batch.payload) == h["raw_size"]
    assert h["event_id"] == 3 and h["is_final_frame_batch"] and h["num_frame_batches"] == 1
    assert batch.payload == frames.tobytes()
    [plain] = encode_session("raw", [frames], [None])[0]
    assert "event_id" not in plain.header


@pytest.mark.parametrize("fmt,max_width,expected", [
    ("jpeg", None, (40, 24)), ("webp", 20, (20, 12)), ("jpeg", 30, (30, 18)),
])
def test_previews(fmt, max_width, expected):
    frames = moving_frames(8)
    encoder = ChunkEncoder(EncodeSettings(fmt=fmt, preview_max_width=max_width))
    batches = encoder.encode_chunk(frames, request_id="r", chunk_index=0, event_id=None)
    assert [b.header["num_frames"] for b in batches] == [6, 2]
    decoder = FrameDecoder()
    for batch in batches:
        h = batch.header
        assert sum(h["payload_lengths"]) == h["total_size"] == len(batch.payload)
        assert (h["preview_width"], h["preview_height"]) == expected == (h["width"], h["height"])
        assert (h["source_width"], h["source_height"]) == (40, 24)
        decoded = decoder.decode(h, batch.payload)
        assert decoded.shape == (h["num_frames"], expected[1], expected[0], 3)
        first = batch.payload[:h["payload_lengths"][0]]
        assert Image.open(io.BytesIO(first)).format == fmt.upper()


def test_jpeg_is_444_and_close_to_source():
    frames = moving_frames(1, h=32, w=32)
    encoder = ChunkEncoder(EncodeSettings(fmt="jpeg"))
    [batch] = encoder.encode_chunk(frames, request_id="r", chunk_index=0, event_id=None)
    img = Image.open(io.BytesIO(batch.payload))
    assert img.layer[0][1:3] == img.layer[1][1:3]  # (h, v) sampling of Y equals Cb: 4:4:4
    decoded = FrameDecoder().decode(batch.header, batch.payload)
    assert np.abs(decoded.astype(int) - frames.astype(int)).mean() < 6


def test_preview_size_rounding():
    assert preview_size(832, 480, 416) == (416, 240)
    assert preview_size(832, 480, 1000) == (832, 480)
    assert preview_size(833, 481, 100) == (100, 58)
