"""The socket's two ends: receiving with a vanished client as `ClientGone`, and writing chunks
(encoding, optional pacing (§8), `chunk_stats` (§4.3))."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.websockets import WebSocket, WebSocketDisconnect

from worldserve.media.framing import CONTENT_TYPES, ChunkEncoder, EncodedBatch, pack


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


class ClientGone(Exception):
    """The client closed the socket or vanished; the session ends without a close frame."""


async def receive_or_gone(websocket: WebSocket) -> dict[str, Any]:
    """The next ASGI receive message (text or bytes); raises ClientGone when the client has
    closed the socket or vanished."""
    try:
        message = await websocket.receive()
    except (WebSocketDisconnect, RuntimeError, OSError):
        raise ClientGone() from None
    if message["type"] == "websocket.disconnect":
        raise ClientGone()
    return message


class SocketWriter:
    """The send side of one socket. A lock keeps a `frame_batch_header` and its binary payload
    adjacent even when the event listener answers an error at the same time."""

    def __init__(self, websocket: WebSocket) -> None:
        self.websocket = websocket
        self._lock = asyncio.Lock()

    async def _send(self, data: bytes) -> None:
        try:
            await self.websocket.send_bytes(data)
        except (WebSocketDisconnect, RuntimeError, OSError):
            raise ClientGone() from None

    async def send_map(self, obj: dict[str, Any]) -> int:
        data = pack(obj)
        async with self._lock:
            await self._send(data)
        return len(data)

    async def send_error(self, content: str, code: str, detail: str | None = None,
                         **extra: Any) -> None:
        body: dict[str, Any] = {"type": "error", "content": content, "code": code}
        if detail:
            body["detail"] = detail
        body.update(extra)
        await self.send_map(body)

    async def send_batch(self, batch: EncodedBatch) -> tuple[float, float, int]:
        """(header write s, raw payload write s, bytes written)."""
        messages = batch.messages()
        async with self._lock:
            started = time.perf_counter()
            await self._send(messages[0])
            header_s = time.perf_counter() - started
            raw_s = 0.0
            if len(messages) == 2:
                started = time.perf_counter()
                await self._send(messages[1])
                raw_s = time.perf_counter() - started
        return header_s, raw_s, sum(len(m) for m in messages)


class Pacer:
    """Releases chunks no faster than `fps_out` frames per second (§8)."""

    def __init__(self, fps_out: float) -> None:
        self.fps_out = fps_out
        self.next_send_at: float | None = None
        self._last_event_id: int | None = None

    async def wait(self, event_id: int | None) -> float:
        """Sleep until the chunk may go; returns the seconds waited."""
        now = time.monotonic()
        if self.next_send_at is None:
            self.next_send_at = now
        if event_id is not None and event_id != self._last_event_id:
            # A control response is never queued behind a backlog.
            self.next_send_at = min(self.next_send_at, now)
            self._last_event_id = event_id
        delay = max(0.0, self.next_send_at - now)
        if delay:
            await asyncio.sleep(delay)
        return delay

    def sent(self, send_start: float, num_frames: int) -> None:
        assert self.next_send_at is not None  # set by wait(), always called first
        self.next_send_at = max(self.next_send_at, send_start) + num_frames / self.fps_out


@dataclass
class GeneratedChunk:
    """A generated chunk on its way to the client, with the timings measured so far."""

    request_id: str
    chunk_index: int
    event_id: int | None
    frames: np.ndarray  # (N, H, W, 3) uint8
    started: float  # perf_counter at the start of request preparation
    prepare_ms: float
    forward_ms: float
    gpu_queue_ms: float
    kv_refresh_ms: float | None


class ChunkSender:
    """Encodes and writes one session's chunks, then its `chunk_stats`."""

    def __init__(self, writer: SocketWriter, encoder: ChunkEncoder, *, session_id: str,
                 trace_id: str, pacer: Pacer | None) -> None:
        self.writer = writer
        self.encoder = encoder
        self.session_id = session_id
        self.trace_id = trace_id
        self.pacer = pacer

    async def send(self, out: GeneratedChunk) -> dict[str, Any]:
        """Write every batch of the chunk and its stats; returns the stats map."""
        build_started = time.perf_counter()
        # Encoding is CPU work (zlib/zstd/Pillow release the GIL): keep the event loop free.
        batches = await asyncio.to_thread(self.encoder.encode_chunk, out.frames,
                                          request_id=out.request_id,
                                          chunk_index=out.chunk_index, event_id=out.event_id)
        build_s = time.perf_counter() - build_started
        pace_s = await self.pacer.wait(out.event_id) if self.pacer else 0.0
        send_start = time.monotonic()
        header_s = raw_s = 0.0
        written = 0
        for batch in batches:
            h, r, n = await self.writer.send_batch(batch)
            header_s, raw_s, written = header_s + h, raw_s + r, written + n
        if self.pacer:
            self.pacer.sent(send_start, len(out.frames))
        stats = self._stats(out, batches, build_s, pace_s, header_s, raw_s, written)
        await self.writer.send_map(stats)
        return stats

    def _stats(self, out: GeneratedChunk, batches: list[EncodedBatch], build_s: float,
               pace_s: float, header_s: float, raw_s: float, written: int) -> dict[str, Any]:
        stats: dict[str, Any] = {
            "type": "chunk_stats", "trace_id": self.trace_id, "session_id": self.session_id,
            "request_id": out.request_id, "chunk_index": out.chunk_index,
            "event_id": out.event_id, "request_prepare_ms": int(round(out.prepare_ms)),
            "scheduler_forward_ms": int(round(out.forward_ms)), "pace_wait_ms": _ms(pace_s),
            "header_write_ms": _ms(header_s), "raw_payload_build_ms": _ms(build_s),
            "raw_write_ms": _ms(raw_s), "ws_write_ms": _ms(header_s) + _ms(raw_s),
            "chunk_total_ms": _ms(time.perf_counter() - out.started),
            "num_batches": len(batches), "num_frames": len(out.frames),
            "raw_bytes": int(out.frames.nbytes), "ws_payload_bytes": written,
            "content_type": CONTENT_TYPES[self.encoder.settings.fmt],
            "gpu_queue_ms": int(round(out.gpu_queue_ms)),
        }
        if out.kv_refresh_ms is not None:
            stats["kv_refresh_ms"] = int(round(out.kv_refresh_ms))
        return stats
