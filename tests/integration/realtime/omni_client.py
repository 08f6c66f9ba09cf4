"""A JSON WebSocket client for vLLM-Omni's `/v1/realtime/video`, and fMP4 checks with PyAV."""

from __future__ import annotations

import asyncio
import io
import json
from dataclasses import dataclass, field
from typing import Any

import av
import numpy as np
import websockets

from tests.support.server import ServerProcess
from worldserve.media.fmp4 import init_segment

ENDPOINT = "/v1/realtime/video"


@dataclass
class OmniChunk:
    metadata: dict[str, Any]
    data: bytes


@dataclass
class OmniSession:
    """One socket: send JSON, collect chunks (metadata + binary) and the other messages."""

    ws: Any
    chunks: list[OmniChunk] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)

    async def send(self, obj: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(obj))

    async def recv_json(self, timeout_s: float = 20.0) -> dict[str, Any]:
        msg = await asyncio.wait_for(self.ws.recv(), timeout_s)
        assert isinstance(msg, str), f"expected a JSON text message, got {len(msg)} bytes"
        return json.loads(msg)

    async def step(self, timeout_s: float = 20.0) -> dict[str, Any]:
        """The next message; a chunk's metadata comes with its binary frame (kept in `chunks`),
        any other message is kept in `messages`."""
        msg = await self.recv_json(timeout_s)
        if msg["type"] != "video.chunk_metadata":
            self.messages.append(msg)
            return msg
        data = await asyncio.wait_for(self.ws.recv(), timeout_s)
        assert isinstance(data, bytes) and len(data) == msg["byte_length"]
        self.chunks.append(OmniChunk(msg, data))
        return msg

    async def next_message(self, timeout_s: float = 20.0) -> dict[str, Any]:
        """The next non-chunk message; chunks met on the way are kept in `chunks`."""
        while True:
            msg = await self.step(timeout_s)
            if msg["type"] != "video.chunk_metadata":
                return msg

    async def until(self, kind: str, timeout_s: float = 20.0) -> dict[str, Any]:
        while True:
            msg = await self.next_message(timeout_s)
            if msg["type"] == kind:
                return msg

    async def wait_chunks(self, count: int, timeout_s: float = 20.0) -> None:
        while len(self.chunks) < count:
            await self.step(timeout_s)

    async def close_code(self, timeout_s: float = 20.0) -> tuple[int, str]:
        try:
            while True:
                await self.next_message(timeout_s)
        except websockets.ConnectionClosed as exc:
            assert exc.rcvd is not None, "the server closed without a close frame"
            return exc.rcvd.code, exc.rcvd.reason


def connect(server: ServerProcess) -> Any:
    return websockets.connect(server.ws_url + ENDPOINT, max_size=None, close_timeout=2)


def start(prompt: str = "a quiet valley", **fields: Any) -> dict[str, Any]:
    return {"type": "session.start", "prompt": prompt, **fields}


@dataclass(frozen=True)
class Decoded:
    frames: np.ndarray  # (N, H, W, 3) uint8
    width: int
    height: int
    fps: float


def decode_fmp4(data: bytes) -> Decoded:
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        return Decoded(np.stack(frames), stream.width, stream.height,
                       float(stream.average_rate or 0))


def decode_chunk(chunks: list[OmniChunk], index: int) -> Decoded:
    """Chunk `index` alone, after the stream's init segment (each chunk opens on a keyframe)."""
    init = init_segment(chunks[0].data)
    data = chunks[index].data if index == 0 else init + chunks[index].data
    return decode_fmp4(data)
