"""A msgpack WebSocket client for realtime tests, and the fake backend's expected frames."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import websockets

from tests.support.server import ServerProcess
from worldserve.engines.realtime.fake import FakeSessionState, prompt_tint, render_frames
from worldserve.media.framing import FrameDecoder

ENDPOINT = "/v1/realtime_video/generate"
FAKE_FRAMES_PER_CHUNK = 12


def fake_config(workdir: Path, **realtime: Any) -> dict[str, Any]:
    """Only the realtime stage, fake backend (no checkpoint needed: model_path is a folder)."""
    overrides = realtime.pop("server_args_overrides", {})
    return {"stages": {
        "generation": {"enabled": False}, "reasoner": {"enabled": False},
        "realtime": {"enabled": True, "backend": "fake", "model_path": str(workdir),
                     "server_args_overrides": overrides, **realtime},
    }}


def start_fake_server(workdir: Path, **realtime: Any) -> ServerProcess:
    server = ServerProcess(workdir, fake_config(workdir, **realtime))
    try:
        server.wait_healthy(timeout_s=60)
    except BaseException:
        server.stop()
        raise
    return server


@dataclass
class Chunk:
    index: int
    headers: list[dict[str, Any]]
    frames: np.ndarray
    stats: dict[str, Any]
    arrived_at: float


@dataclass
class Session:
    """One socket: send maps, read chunks (decoded), errors and the close."""

    ws: Any
    decoder: FrameDecoder = field(default_factory=FrameDecoder)
    errors: list[dict[str, Any]] = field(default_factory=list)
    raw_messages: list[Any] = field(default_factory=list)

    async def send(self, obj: dict[str, Any]) -> None:
        await self.ws.send(msgpack.packb(obj, use_bin_type=True))

    async def recv_map(self, timeout_s: float = 10.0) -> dict[str, Any]:
        msg = await asyncio.wait_for(self.ws.recv(), timeout_s)
        assert isinstance(msg, bytes), "server messages are binary"
        return msgpack.unpackb(msg, raw=False)

    async def read_chunk(self, timeout_s: float = 20.0) -> Chunk:
        """The next whole chunk; errors met on the way are kept in `errors`."""
        headers, parts = [], []
        while True:
            msg = await asyncio.wait_for(self.ws.recv(), timeout_s)
            self.raw_messages.append(msg)
            header = msgpack.unpackb(msg, raw=False)
            kind = header["type"]
            if kind == "error":
                self.errors.append(header)
                continue
            if kind == "chunk_stats":
                assert headers, "chunk_stats before any frame batch"
                return Chunk(header["chunk_index"], headers, np.concatenate(parts), header,
                             time.monotonic())
            if kind == "frame_batch_header":
                payload = await asyncio.wait_for(self.ws.recv(), timeout_s)
                self.raw_messages.append(payload)
                assert isinstance(payload, bytes) and len(payload) == header["total_size"]
            else:
                assert kind == "frame_batch", kind
                payload = header.pop("payload")
            headers.append(header)
            parts.append(self.decoder.decode(header, payload))

    async def read_until_close(self, timeout_s: float = 30.0) -> tuple[list[Chunk], int, str]:
        chunks: list[Chunk] = []
        try:
            while True:
                chunks.append(await self.read_chunk(timeout_s))
        except websockets.ConnectionClosed as exc:
            assert exc.rcvd is not None, "the server closed without a close frame"
            return chunks, exc.rcvd.code, exc.rcvd.reason

    async def wait_close(self, timeout_s: float = 15.0) -> tuple[int, str, list[dict[str, Any]]]:
        """Skip frames until the close; returns (code, reason, every map seen)."""
        seen = []
        deadline = asyncio.get_running_loop().time() + 4 * timeout_s  # frames may keep coming
        try:
            while True:
                if asyncio.get_running_loop().time() > deadline:
                    raise AssertionError(f"the server did not close within {4 * timeout_s:g} s")
                msg = await asyncio.wait_for(self.ws.recv(), timeout_s)
                try:
                    seen.append(msgpack.unpackb(msg, raw=False))
                except Exception:
                    pass  # a raw payload after a frame_batch_header
        except websockets.ConnectionClosed as exc:
            assert exc.rcvd is not None
            return exc.rcvd.code, exc.rcvd.reason, seen


def connect(server: ServerProcess, query: str = "") -> Any:
    url = server.ws_url + ENDPOINT + (f"?{query}" if query else "")
    # A short close timeout: a test client that stopped reading must not stall the test.
    return websockets.connect(url, max_size=None, close_timeout=2)


class ExpectedFrames:
    """Recomputes the fake backend's frames chunk by chunk for a given camera per chunk."""

    def __init__(self, prompt: str, seed: int = 42, width: int = 832, height: int = 480,
                 first_frame_mean: int = 0) -> None:
        self.seed = seed
        self.state = FakeSessionState(tint=prompt_tint(prompt, seed, first_frame_mean), seed=seed,
                                      width=width, height=height, window_frames=21)

    def chunk(self, camera: list[list[str]] | None = None, prompt: str | None = None,
              num_frames: int = FAKE_FRAMES_PER_CHUNK) -> np.ndarray:
        if prompt is not None:
            self.state.tint = prompt_tint(prompt, self.seed)
        return render_frames(self.state, camera, num_frames)
