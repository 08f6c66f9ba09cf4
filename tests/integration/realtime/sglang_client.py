"""The realtime client of SGLang's own tests, as a set of acceptance rules.

Written from a reading of `collect_realtime_output` and `decode_realtime_raw_rgb_frames` in
sgl-project/sglang `python/sglang/multimodal_gen/test/server/realtime_consistency.py`
(revision bb23752, the one that accepts inline batches; an older revision, 00f505a, accepted
only `frame_batch_header` + binary). Its rules, which worldserve's stream must satisfy:

- every control message is msgpack (decoded with msgspec); `error` fails, `chunk_stats` is kept;
- `frame_batch` carries its payload inline under `payload` (must decode to `bytes`);
- `frame_batch_header` is followed by exactly one binary message holding the payload;
- any other message type is an error;
- `content_type` must be raw RGB or (RGB/RGBA) delta-gzip; the restored payload must be exactly
  `num_frames × bytes_per_frame` bytes, reshaped to `height × width × channels`;
- delta-gzip restores against the previous frame only when `delta_reference` is
  `"previous-frame"`;
- a chunk is complete at `is_final_frame_batch` (default true).
"""

from __future__ import annotations

import asyncio
import gzip
from dataclasses import dataclass, field
from typing import Any

import msgspec.msgpack
import numpy as np
import websockets

RAW = "application/x-raw-rgb"
DELTA_GZIP = ("application/x-raw-rgb-delta-gzip", "application/x-raw-rgba-delta-gzip")
TIMEOUT_S = 60.0


class RejectedBySglangClient(AssertionError):
    """A message SGLang's client would refuse."""


@dataclass
class Collected:
    frames: list[np.ndarray] = field(default_factory=list)
    chunk_stats: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)  # "inline" or "split", per batch


def _restore_delta(payload: bytes, bytes_per_frame: int, num_frames: int,
                   reference: bytes | None) -> bytes:
    residuals = np.frombuffer(gzip.decompress(payload), np.uint8)
    if residuals.size != bytes_per_frame * num_frames:
        raise RejectedBySglangClient("delta payload has the wrong size")
    out = np.empty_like(residuals).reshape(num_frames, bytes_per_frame)
    prev = None if reference is None else np.frombuffer(reference, np.uint8)
    for i, d in enumerate(residuals.reshape(num_frames, bytes_per_frame)):
        out[i] = d if prev is None else d ^ prev
        prev = out[i]
    return out.tobytes()


def decode_frames(header: dict[str, Any], payload: bytes,
                  previous: bytes | None) -> list[np.ndarray]:
    content_type = header.get("content_type")
    if content_type != RAW and content_type not in DELTA_GZIP:
        raise RejectedBySglangClient(f"unsupported content type {content_type!r}")
    width, height = int(header["width"]), int(header["height"])
    channels, num_frames = int(header["channels"]), int(header["num_frames"])
    bytes_per_frame = int(header["bytes_per_frame"])
    if content_type in DELTA_GZIP:
        reference = previous if header.get("delta_reference") == "previous-frame" else None
        payload = _restore_delta(payload, bytes_per_frame, num_frames, reference)
    if len(payload) != num_frames * bytes_per_frame:
        raise RejectedBySglangClient("payload size mismatch")
    frames = np.frombuffer(payload, np.uint8).reshape(num_frames, height, width, channels)
    return [f[:, :, :3].copy() for f in frames]


async def collect(ws_url: str, init: dict[str, Any], num_chunks: int) -> Collected:
    got = Collected()
    async with websockets.connect(ws_url, max_size=None, ping_interval=None) as ws:
        await ws.send(msgspec.msgpack.encode(init))
        chunks: set[int] = set()
        previous: bytes | None = None
        while len(chunks) < num_chunks:
            header = msgspec.msgpack.decode(await asyncio.wait_for(ws.recv(), TIMEOUT_S))
            kind = header.get("type")
            if kind == "error":
                raise RejectedBySglangClient(f"generation failed: {header.get('content')}")
            if kind == "chunk_stats":
                got.chunk_stats.append(header)
                continue
            if kind == "frame_batch":
                payload = header.pop("payload", None)
                got.paths.append("inline")
            elif kind == "frame_batch_header":
                payload = await asyncio.wait_for(ws.recv(), TIMEOUT_S)
                got.paths.append("split")
            else:
                raise RejectedBySglangClient(f"unexpected realtime message: {header}")
            if not isinstance(payload, bytes):
                raise RejectedBySglangClient("frame payload must be bytes")
            frames = decode_frames(header, payload, previous)
            got.frames.extend(frames)
            if frames:
                previous = frames[-1].tobytes()
            if header.get("is_final_frame_batch", True):
                chunks.add(int(header["chunk_index"]))
    return got
