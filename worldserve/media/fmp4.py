"""One fragmented-MP4 (m4s) H.264 stream, written chunk by chunk (PyAV + hand-written fragments).

The first chunk's bytes start with the init segment (`ftyp` + `moov`); every chunk then carries
exactly one fragment (`moof` + `mdat`) holding exactly that chunk's frames, opening with a
keyframe, so a client that concatenates the chunks in receive order has one playable stream,
and a chunk prefixed with the init segment decodes on its own (a client may join or drop chunks).

Why the fragments are written here and not by libavformat: its mp4 muxer closes a fragment only
when the *next* packet arrives (or on a flush that PyAV does not expose), so each chunk would
hold back its last frame until the next chunk, a frame of latency per chunk and a per-chunk
frame count that disagrees with the chunk's metadata. PyAV still writes the init segment (from
the encoder's own `avcC`) and does the encoding; libx264 runs with `tune=zerolatency` and no
B-frames, so every frame's packet comes out at once and decode order is presentation order.
"""

from __future__ import annotations

import io
import re
import struct
import threading
from fractions import Fraction

import av
import numpy as np

from worldserve.media.video import compression_to_crf

TRACK_ID = 1
# trun per-sample flags (ISO/IEC 14496-12 §8.8.3.1): a sync sample, and a non-sync one.
SYNC_SAMPLE_FLAGS = 0x02000000
NON_SYNC_SAMPLE_FLAGS = 0x01010000
TFHD_DEFAULT_BASE_IS_MOOF = 0x020000
TRUN_FLAGS = 0x000001 | 0x000100 | 0x000200 | 0x000400  # offset, duration, size, flags


def _box(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", 8 + len(payload)) + kind + payload


def _full_box(kind: bytes, version: int, flags: int, payload: bytes) -> bytes:
    return _box(kind, struct.pack(">I", (version << 24) | flags) + payload)


def iter_boxes(data: bytes) -> list[tuple[bytes, int, int]]:
    """Top-level boxes as (type, offset, size); raises ValueError on a truncated box."""
    boxes, offset = [], 0
    while offset < len(data):
        if offset + 8 > len(data):
            raise ValueError(f"truncated box header at byte {offset}")
        size = struct.unpack(">I", data[offset:offset + 4])[0]
        if size < 8 or offset + size > len(data):
            raise ValueError(f"box at byte {offset} claims {size} bytes")
        boxes.append((data[offset + 4:offset + 8], offset, size))
        offset += size
    return boxes


def annexb_to_avcc(data: bytes) -> bytes:
    """Start-code delimited NAL units (what libx264 emits) -> 4-byte length prefixed ones (what
    an mp4 sample holds)."""
    if not data.startswith((b"\x00\x00\x01", b"\x00\x00\x00\x01")):
        return data  # already length-prefixed
    nals = [nal.rstrip(b"\x00") for nal in re.split(b"\x00\x00\x01", data)]
    return b"".join(struct.pack(">I", len(nal)) + nal for nal in nals if nal)


def init_segment(data: bytes) -> bytes:
    """The `ftyp` + `moov` prefix of a stream's first chunk."""
    end = 0
    for kind, offset, size in iter_boxes(data):
        if kind not in (b"ftyp", b"moov"):
            break
        end = offset + size
    return data[:end]


def _track_timescale(moov: bytes) -> int:
    at = moov.find(b"mdhd")
    if at < 0:
        raise ValueError("the init segment has no mdhd box")
    version = moov[at + 4]
    offset = at + 8 + (16 if version == 1 else 8)  # after version/flags and the two times
    return struct.unpack(">I", moov[offset:offset + 4])[0]


class FragmentedMP4Writer:
    """H.264 fMP4 of one session: `write(frames)` returns that chunk's bytes. Frames are uint8
    RGB (N, H, W, 3) with a fixed size; odd sizes are cropped to even (yuv420p)."""

    def __init__(self, width: int, height: int, fps: int, compression: int = 70) -> None:
        self.width, self.height = width - width % 2, height - height % 2
        self._header = io.BytesIO()
        self._container = av.open(self._header, mode="w", format="mp4",
                                  options={"movflags": "+empty_moov+default_base_moof"})
        self._stream = self._container.add_stream("libx264", rate=Fraction(max(1, fps)))
        self._stream.width, self._stream.height = self.width, self.height
        self._stream.pix_fmt = "yuv420p"
        self._stream.options = {"preset": "ultrafast", "tune": "zerolatency",
                                "crf": str(compression_to_crf(compression))}
        self._stream.codec_context.max_b_frames = 0
        self._container.start_encoding()  # writes ftyp + moov (with the encoder's avcC)
        self._init = self._header.getvalue()
        self._timescale = _track_timescale(self._init)
        self._sequence = 0
        self._next_dts = 0  # in track timescale units
        self._frame_ticks = round(self._timescale / max(1, fps))
        # write() runs in a worker thread; close() may come from the event loop meanwhile.
        self._lock = threading.Lock()
        self._closed = False

    def write(self, frames: np.ndarray) -> bytes:
        """One fragment with exactly these frames (the init segment first, on the first call)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the fMP4 writer is closed")
            return self._write(frames)

    def _write(self, frames: np.ndarray) -> bytes:
        packets = []
        for index, frame in enumerate(frames):
            image = av.VideoFrame.from_ndarray(
                np.ascontiguousarray(frame[: self.height, : self.width]), format="rgb24")
            if index == 0:  # each chunk opens with a keyframe: it decodes after the init alone
                image.pict_type = av.video.frame.PictureType.I
            packets.extend(self._stream.encode(image))
        prefix = self._init if self._sequence == 0 else b""
        self._sequence += 1
        return prefix + self._fragment(packets)

    def close(self) -> None:
        """Release the encoder (the stream needs no trailer: each fragment is complete)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._container.close()
            except (av.FFmpegError, ValueError):
                pass  # nothing was muxed into the header container; its trailer is not needed

    def _fragment(self, packets: list[av.Packet]) -> bytes:
        samples = [annexb_to_avcc(bytes(packet)) for packet in packets]
        flags = [SYNC_SAMPLE_FLAGS if packet.is_keyframe else NON_SYNC_SAMPLE_FLAGS
                 for packet in packets]
        base_dts = self._next_dts
        self._next_dts += self._frame_ticks * len(samples)
        mfhd = _full_box(b"mfhd", 0, 0, struct.pack(">I", self._sequence))
        tfhd = _full_box(b"tfhd", 0, TFHD_DEFAULT_BASE_IS_MOOF, struct.pack(">I", TRACK_ID))
        tfdt = _full_box(b"tfdt", 1, 0, struct.pack(">Q", base_dts))

        def moof(data_offset: int) -> bytes:
            entries = b"".join(struct.pack(">III", self._frame_ticks, len(sample), flag)
                               for sample, flag in zip(samples, flags))
            trun = _full_box(b"trun", 0, TRUN_FLAGS,
                             struct.pack(">Ii", len(samples), data_offset) + entries)
            return _box(b"moof", mfhd + _box(b"traf", tfhd + tfdt + trun))

        size = len(moof(0))  # the offset does not change the box's size
        return moof(size + 8) + _box(b"mdat", b"".join(samples))
