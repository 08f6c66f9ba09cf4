"""`worldserve realtime`: a client of `WS /v1/realtime_video/generate`.

Sends one `init`, decodes every batch (raw, delta-gzip, delta-zstd, jpeg, webp), writes the
frames to an H.264 MP4 with PyAV and prints one line of stats per chunk.

Exit codes: 0 the session completed (close 1000); 1 the server failed or the connection
broke; 2 the request was refused as invalid (bad init, bad first frame).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable

import av
import msgpack
import numpy as np
import websockets

from worldserve.clients.auth import MISSING_KEY_HINT, bearer_headers
from worldserve.media.framing import FrameDecoder, FramingError, pack

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2
ENDPOINT = "/v1/realtime_video/generate"
DEFAULT_FPS = 16


@dataclass(frozen=True)
class RealtimeClientOptions:
    url: str
    prompt: str
    first_frame: Path | None = None
    actions: str | None = None
    max_chunks: int = 4
    encoding: str = "raw"
    out: Path | None = None
    size: str | None = None
    seed: int | None = None
    fps: int | None = None
    # The server's --api-key (clients/auth.py); kept out of the repr, hence of logs
    api_key: str | None = field(default=None, repr=False)

    def init_message(self) -> dict[str, Any]:
        init: dict[str, Any] = {
            "type": "init",
            "prompt": self.prompt,
            "max_chunks": self.max_chunks,
            "realtime_output_format": self.encoding,
        }
        if self.first_frame is not None:
            init["first_frame"] = self.first_frame.read_bytes()
        if self.actions:
            init["condition_inputs"] = {"action": self.actions}
        for key, value in (("size", self.size), ("seed", self.seed), ("fps", self.fps)):
            if value is not None:
                init[key] = value
        return init


@dataclass
class SessionOutcome:
    exit_code: int = EXIT_FAILED
    close_code: int | None = None
    close_reason: str = ""
    num_frames: int = 0
    chunk_stats: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)


class Mp4Writer:
    """H.264 (yuv420p) MP4; opened at the first frame. Odd sizes are cropped to even."""

    def __init__(self, path: Path, fps: int) -> None:
        self.path = path
        self.fps = fps
        self._container: Any = None
        self._stream: Any = None

    def write(self, frames: np.ndarray) -> None:
        height, width = (frames.shape[1] // 2) * 2, (frames.shape[2] // 2) * 2
        if self._container is None:
            self._container = av.open(str(self.path), mode="w")
            self._stream = self._container.add_stream("libx264", rate=Fraction(self.fps))
            self._stream.width, self._stream.height = width, height
            self._stream.pix_fmt = "yuv420p"
        for frame in frames:
            video = av.VideoFrame.from_ndarray(
                np.ascontiguousarray(frame[:height, :width]), format="rgb24"
            )
            for packet in self._stream.encode(video):
                self._container.mux(packet)

    def close(self) -> None:
        if self._container is not None:
            for packet in self._stream.encode():
                self._container.mux(packet)
            self._container.close()


def websocket_url(url: str) -> str:
    """Accepts ws(s):// or http(s):// base URLs, with or without the endpoint path."""
    if url.startswith("http"):
        url = "ws" + url[len("http") :]
    return url if url.rstrip("/").endswith(ENDPOINT) else url.rstrip("/") + ENDPOINT


def format_stats(stats: dict[str, Any]) -> str:
    line = (
        f"chunk {stats.get('chunk_index')}: {stats.get('num_frames')} frames, "
        f"forward {stats.get('scheduler_forward_ms')} ms, queue {stats.get('gpu_queue_ms')} ms, "
        f"encode {stats.get('raw_payload_build_ms')} ms, write {stats.get('ws_write_ms')} ms, "
        f"{stats.get('ws_payload_bytes')} B on the wire ({stats.get('raw_bytes')} raw)"
    )
    if stats.get("event_id") is not None:
        line += f", event {stats['event_id']}"
    return line


async def receive_session(
    ws: Any,
    on_frames: Callable[[dict[str, Any], np.ndarray], None],
    on_stats: Callable[[dict[str, Any]], None],
    outcome: SessionOutcome,
) -> None:
    """Decode until the server closes; fills `outcome` (spec §10 decode loop)."""
    decoder = FrameDecoder()
    pending: dict[str, Any] | None = None
    try:
        async for message in ws:
            if pending is not None:
                header, payload, pending = pending, message, None
            else:
                header = msgpack.unpackb(message, raw=False)
                kind = header.get("type")
                if kind == "frame_batch_header":
                    pending = header
                    continue
                if kind == "chunk_stats":
                    outcome.chunk_stats.append(header)
                    on_stats(header)
                    continue
                if kind == "error":
                    outcome.errors.append(header)
                    if header.get("code") == "invalid_init":
                        return  # the server waits for another init; this client gives up
                    continue
                if kind != "frame_batch":
                    continue
                payload = header["payload"]
            frames = decoder.decode(header, payload)
            outcome.num_frames += len(frames)
            on_frames(header, frames)
    except websockets.ConnectionClosed:
        pass
    if ws.close_code is not None:
        outcome.close_code = ws.close_code
        outcome.close_reason = ws.close_reason or ""


async def run_session(
    opts: RealtimeClientOptions, print_line: Callable[[str], None] = print
) -> SessionOutcome:
    outcome = SessionOutcome()
    writer = Mp4Writer(opts.out, opts.fps or DEFAULT_FPS) if opts.out else None
    try:
        async with websockets.connect(websocket_url(opts.url), max_size=None,
                                      additional_headers=bearer_headers(opts.api_key)) as ws:
            await ws.send(pack(opts.init_message()))
            await receive_session(
                ws,
                lambda header, frames: writer.write(frames) if writer else None,
                lambda stats: print_line(format_stats(stats)),
                outcome,
            )
    except (OSError, websockets.InvalidHandshake, websockets.InvalidURI) as exc:
        print_line(f"error: cannot connect to {opts.url}: {exc}{_auth_hint(exc, opts)}")
        return outcome
    except FramingError as exc:
        print_line(f"error: undecodable frames: {exc}")
        return outcome
    finally:
        if writer is not None:
            writer.close()
    for error in outcome.errors:
        print_line(f"server error: {error.get('content')} ({error.get('detail', '')})")
    if any(e.get("code") == "invalid_init" for e in outcome.errors):
        outcome.exit_code = EXIT_INVALID
    elif outcome.close_code == 1000:
        outcome.exit_code = EXIT_OK
    print_line(
        f"closed {outcome.close_code} {outcome.close_reason!r}: "
        f"{len(outcome.chunk_stats)} chunks, {outcome.num_frames} frames"
        + (f" -> {opts.out}" if opts.out and outcome.num_frames else "")
    )
    return outcome


def _auth_hint(exc: Exception, opts: RealtimeClientOptions) -> str:
    """What to do about a 401 upgrade (the server runs with --api-key)."""
    if not isinstance(exc, websockets.InvalidStatus) or exc.response.status_code != 401:
        return ""
    return " (the server refused the API key)" if opts.api_key else f" ({MISSING_KEY_HINT})"


def main(opts: RealtimeClientOptions) -> int:
    return asyncio.run(run_session(opts)).exit_code
