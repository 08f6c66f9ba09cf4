"""Realtime frame transport: batching, payload encodings and headers (spec realtime-video §4-5).

Pure numpy / zlib / zstandard / Pillow (no torch): used by the api process to encode chunks
and by clients to decode them. Frames are uint8 arrays of shape (N, H, W, 3), RGB24.

Encodings: `raw` (frames concatenated), `delta-gzip` / `delta-zstd` (XOR with the previous
frame, then one gzip member / one zstd frame over the concatenation; §5.2-5.3) and `jpeg` /
`webp` previews (one encoded image per frame, split with `payload_lengths`).
"""

from __future__ import annotations

import io
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Literal

import msgpack
import numpy as np
import zstandard
from PIL import Image

OutputFormat = Literal["raw", "delta-gzip", "delta-zstd", "jpeg", "webp"]
OUTPUT_FORMATS: tuple[str, ...] = ("raw", "delta-gzip", "delta-zstd", "jpeg", "webp")

CONTENT_TYPES: dict[str, str] = {
    "raw": "application/x-raw-rgb",
    "delta-gzip": "application/x-raw-rgb-delta-gzip",
    "delta-zstd": "application/x-raw-rgb-delta-zstd",
    "jpeg": "image/jpeg",
    "webp": "image/webp",
}
RAW_FRAMES_PER_BATCH = 16
PREVIEW_FRAMES_PER_BATCH = 6
# Payloads of this size or more travel as a header message followed by one binary message.
INLINE_PAYLOAD_LIMIT = 65_536
DEFAULT_DELTA_LEVEL = {"delta-gzip": 1, "delta-zstd": 3}
DELTA_LEVEL_RANGE = {"delta-gzip": (0, 9), "delta-zstd": (1, 19)}
DEFAULT_QUALITY = {"jpeg": 95, "webp": 90}
DELTA_REFERENCE = "previous-frame"


class FramingError(ValueError):
    """A payload that does not decode to what its header announces."""


def is_preview(fmt: str) -> bool:
    return fmt in ("jpeg", "webp")


def is_delta(fmt: str) -> bool:
    return fmt in ("delta-gzip", "delta-zstd")


def frames_per_batch(fmt: str) -> int:
    return PREVIEW_FRAMES_PER_BATCH if is_preview(fmt) else RAW_FRAMES_PER_BATCH


def batch_bounds(num_frames: int, fmt: str) -> list[tuple[int, int]]:
    """[start, end) frame ranges of the transport batches of one chunk."""
    size = frames_per_batch(fmt)
    return [(start, min(start + size, num_frames)) for start in range(0, num_frames, size)]


# ----------------------------------------------------------------------------- delta codecs


def delta_residuals(frames: np.ndarray, reference: np.ndarray | None) -> np.ndarray:
    """D[0] = F[0] ^ R (or F[0]), D[i] = F[i] ^ F[i-1]; frames (N, H, W, 3) -> same shape."""
    out = frames.copy()
    out[1:] ^= frames[:-1]
    if reference is not None:
        out[0] ^= reference
    return out


def delta_encode(frames: np.ndarray, encoding: str, level: int,
                 reference: np.ndarray | None = None) -> bytes:
    """One gzip member (wbits 31) or one zstd frame over the concatenated XOR residuals."""
    data = np.ascontiguousarray(delta_residuals(frames, reference)).tobytes()
    if encoding == "delta-gzip":
        comp = zlib.compressobj(level=level, wbits=31)
        return comp.compress(data) + comp.flush()
    if encoding == "delta-zstd":
        return zstandard.ZstdCompressor(level=level).compress(data)
    raise ValueError(f"unknown delta encoding {encoding!r}")


def delta_decode(payload: bytes, encoding: str, shape: tuple[int, int, int, int],
                 reference: np.ndarray | None = None) -> np.ndarray:
    """Inverse of `delta_encode`; `shape` is (N, H, W, 3). Raises FramingError on size mismatch."""
    expected = int(np.prod(shape))
    try:
        if encoding == "delta-gzip":
            raw = zlib.decompress(payload, wbits=31)
        elif encoding == "delta-zstd":
            raw = zstandard.ZstdDecompressor().decompress(payload, max_output_size=expected)
        else:
            raise FramingError(f"unknown delta encoding {encoding!r}")
    except (zlib.error, zstandard.ZstdError) as exc:
        raise FramingError(f"{encoding} payload does not decompress: {exc}") from exc
    if len(raw) != expected:
        raise FramingError(f"delta payload has {len(raw)} bytes, header says {expected}")
    residuals = np.frombuffer(raw, np.uint8).reshape(shape).copy()
    if reference is not None:
        residuals[0] ^= reference
    return np.bitwise_xor.accumulate(residuals, axis=0)


# ----------------------------------------------------------------------------- previews


def preview_size(width: int, height: int, max_width: int | None) -> tuple[int, int]:
    """Frames wider than `max_width` shrink to it; height round(h * w' / w), at least 1."""
    if not max_width or width <= max_width:
        return width, height
    return max_width, max(1, round(height * max_width / width))


def encode_previews(frames: np.ndarray, fmt: str, quality: int,
                    max_width: int | None) -> tuple[list[bytes], tuple[int, int]]:
    """One encoded image per frame; returns (images, (preview_width, preview_height))."""
    height, width = frames.shape[1:3]
    size = preview_size(width, height, max_width)
    images = []
    for frame in frames:
        img = Image.fromarray(frame, "RGB")
        if size != (width, height):
            img = img.resize(size, Image.Resampling.BICUBIC)
        buf = io.BytesIO()
        if fmt == "jpeg":
            img.save(buf, format="JPEG", quality=quality, subsampling=0)
        else:
            img.save(buf, format="WEBP", quality=quality, method=0)
        images.append(buf.getvalue())
    return images, size


def decode_previews(payload: bytes, lengths: list[int]) -> np.ndarray:
    if sum(lengths) != len(payload):
        raise FramingError(f"payload_lengths sum to {sum(lengths)}, payload has {len(payload)}")
    frames, offset = [], 0
    for length in lengths:
        with Image.open(io.BytesIO(payload[offset:offset + length])) as img:
            frames.append(np.asarray(img.convert("RGB")))
        offset += length
    return np.stack(frames)


# ----------------------------------------------------------------------------- batches


@dataclass(frozen=True)
class EncodeSettings:
    """How one session's chunks are encoded (from its `init`)."""

    fmt: str = "raw"
    delta_level: int | None = None  # None: DEFAULT_DELTA_LEVEL[fmt]
    quality: int | None = None  # None: DEFAULT_QUALITY[fmt]
    preview_max_width: int | None = None

    @property
    def level(self) -> int:
        return DEFAULT_DELTA_LEVEL[self.fmt] if self.delta_level is None else self.delta_level

    @property
    def image_quality(self) -> int:
        return DEFAULT_QUALITY[self.fmt] if self.quality is None else self.quality


@dataclass
class EncodedBatch:
    """One transport batch: its header keys (without `type`) and its payload."""

    header: dict[str, Any]
    payload: bytes
    encode_ms: float = 0.0

    def messages(self) -> list[bytes]:
        """Inline `frame_batch` below 64 KiB, else `frame_batch_header` + the raw payload."""
        return frame_messages(self.header, self.payload)


def frame_messages(header: dict[str, Any], payload: bytes) -> list[bytes]:
    if len(payload) < INLINE_PAYLOAD_LIMIT:
        return [pack({"type": "frame_batch", **header, "payload": payload})]
    return [pack({"type": "frame_batch_header", **header}), payload]


def pack(obj: dict[str, Any]) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False)


@dataclass
class ChunkEncoder:
    """Encodes one session's chunks, keeping the delta reference state across batches.

    Reference rule (§5.2): frame 0 of a batch is a delta against the last frame of the
    previous batch when the batch is not part of chunk 0, the previous batch had the same
    frame size and carried the same `event_id` (or both none).
    """

    settings: EncodeSettings
    _last_frame: np.ndarray | None = field(default=None, init=False)
    _last_event_id: int | None = field(default=None, init=False)

    def encode_chunk(self, frames: np.ndarray, *, request_id: str, chunk_index: int,
                     event_id: int | None) -> list[EncodedBatch]:
        fmt = self.settings.fmt
        bounds = batch_bounds(len(frames), fmt)
        out = []
        for index, (start, end) in enumerate(bounds):
            started = time.perf_counter()
            header: dict[str, Any] = {
                "request_id": request_id, "chunk_index": chunk_index,
                "content_type": CONTENT_TYPES[fmt], "num_frames": end - start,
                "frame_batch_index": index, "num_frame_batches": len(bounds),
                "is_final_frame_batch": index == len(bounds) - 1, "encoding": fmt,
            }
            if event_id is not None:
                header["event_id"] = event_id
            batch = frames[start:end]
            if is_preview(fmt):
                payload = self._encode_preview(batch, header)
            else:
                payload = self._encode_raw(batch, header, chunk_index, event_id)
            header["total_size"] = len(payload)
            out.append(EncodedBatch(header, payload, (time.perf_counter() - started) * 1000))
        return out

    def _encode_raw(self, batch: np.ndarray, header: dict[str, Any], chunk_index: int,
                    event_id: int | None) -> bytes:
        n, height, width, channels = batch.shape
        bytes_per_frame = height * width * channels
        header.update(format="rgb24", width=width, height=height, channels=channels,
                      bytes_per_frame=bytes_per_frame, raw_size=n * bytes_per_frame)
        fmt = self.settings.fmt
        if fmt == "raw":
            return np.ascontiguousarray(batch).tobytes()
        reference = None
        last = self._last_frame
        if (chunk_index > 0 and last is not None and last.shape == batch.shape[1:]
                and self._last_event_id == event_id):
            reference = last
            header["delta_reference"] = DELTA_REFERENCE
        header["compression_level"] = self.settings.level
        self._last_frame = batch[-1].copy()
        self._last_event_id = event_id
        return delta_encode(batch, fmt, self.settings.level, reference)

    def _encode_preview(self, batch: np.ndarray, header: dict[str, Any]) -> bytes:
        height, width = batch.shape[1:3]
        fmt = self.settings.fmt
        images, (pw, ph) = encode_previews(batch, fmt, self.settings.image_quality,
                                           self.settings.preview_max_width)
        header.update(format=fmt, width=pw, height=ph, source_width=width,
                      source_height=height, preview_width=pw, preview_height=ph,
                      payload_lengths=[len(img) for img in images])
        return b"".join(images)


@dataclass
class FrameDecoder:
    """Client side: decodes any batch, keeping the last decoded raw frame for delta references."""

    _last_frame: np.ndarray | None = field(default=None, init=False)

    def decode(self, header: dict[str, Any], payload: bytes) -> np.ndarray:
        """Frames (N, H, W, 3) uint8 of one batch."""
        encoding = header.get("encoding", "raw")
        n = int(header["num_frames"])
        if len(payload) != int(header.get("total_size", len(payload))):
            raise FramingError(f"payload has {len(payload)} bytes, total_size says "
                               f"{header['total_size']}")
        if is_preview(encoding):
            return decode_previews(payload, list(header["payload_lengths"]))
        shape = (n, int(header["height"]), int(header["width"]), int(header.get("channels", 3)))
        if encoding == "raw":
            if len(payload) != int(np.prod(shape)):
                raise FramingError(f"raw payload has {len(payload)} bytes, expected "
                                   f"{int(np.prod(shape))}")
            frames = np.frombuffer(payload, np.uint8).reshape(shape)
        else:
            reference = None
            if header.get("delta_reference"):
                if self._last_frame is None or self._last_frame.shape != shape[1:]:
                    raise FramingError("batch needs a reference frame this decoder does not have")
                reference = self._last_frame
            frames = delta_decode(payload, encoding, shape, reference)
        self._last_frame = frames[-1].copy()
        return frames
