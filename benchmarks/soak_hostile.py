"""What `benchmarks/soak.py --faults` adds to the clients of benchmarks/soak_load.py: clients
that vanish mid-upload, mid-SSE and mid-WebSocket, and bodies beyond the hostile suite's
catalogue (tests/integration/hostile/test_bodies.py, docs/hostile-input.md): msgpack and JSON
bombs, images that declare huge dimensions, videos that declare (or have) huge frame counts.

A bomb case is (name, send, expected status) like the catalogue's: anything but a 5xx is the
server surviving it; a status other than the expected one is counted (`hostile_other_4xx`)."""

from __future__ import annotations

import asyncio
import io
import json
import random
import struct
import zlib
from typing import Any

import msgpack
import numpy as np
import websockets
from PIL import Image

from benchmarks import soak_load
from tests.integration.hostile.test_bodies import CASES, data_url, frame, js, raw, video_upload
from worldserve.media.video import encode_mp4

FAULT_WEIGHTS = {"vanish_upload": 1, "vanish_sse": 1, "vanish_ws": 1, "hostile": 1}
MB = 1024 * 1024


def huge_png(side: int = 65535) -> bytes:
    """A PNG whose header declares side x side pixels, with one row of data."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    row = zlib.compress(b"\0" * (1 + 3 * side))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", row) + \
        chunk(b"IEND", b"")


def huge_jpeg(side: int = 65500) -> bytes:
    """A real 16x16 JPEG whose start-of-frame is rewritten to declare side x side."""
    out = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 30, 30)).save(out, "JPEG")
    data = bytearray(out.getvalue())
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", side, side)
    return bytes(data)


def long_video(num_frames: int = 2000) -> bytes:
    """A 16x16 H.264 MP4 with `num_frames` real frames at 240 fps (small, long to demux)."""
    out = io.BytesIO()
    encode_mp4(np.zeros((num_frames, 16, 16, 3), np.uint8), 240, out)
    return out.getvalue()


def lying_video() -> bytes:
    """A 5-frame MP4 whose sample table (stts) and durations claim 2**31 - 1 frames."""
    data = bytearray(long_video(5))
    stts = data.index(b"stts")
    data[stts + 12:stts + 16] = struct.pack(">I", 2**31 - 1)  # first entry's sample count
    for box in (b"mvhd", b"mdhd"):
        at = data.index(box)  # version 0: flags, created, modified, timescale, duration
        data[at + 20:at + 24] = struct.pack(">I", 2**32 - 1)
    return bytes(data)


def chat_video(data: bytes) -> Any:
    return js("/v1/chat/completions", lambda m: {
        "model": m, "max_tokens": 4,
        "messages": [{"role": "user", "content": [
            {"type": "video_url", "video_url": {"url": data_url(data, "video/mp4")}},
            {"type": "text", "text": "what happens?"}]}]})


def chat_image(data: bytes, mime: str) -> Any:
    return js("/v1/chat/completions", lambda m: {
        "model": m, "max_tokens": 4,
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_url(data, mime)}}]}]})


MSGPACK = "application/msgpack"
WIDE_JSON = json.dumps({"prompt": "x", "seed": [0] * 1_000_000}).encode()
# unknown top-level keys are ignored there (spec §4.1): the whole body is parsed, then the
# last key refused, so that no session is opened
MANY_KEYS = json.dumps({"system_prompt": "x", **{f"k{i}": 0 for i in range(200_000)},
                        "sampling": "not an object"}).encode()

BOMBS: list[tuple[str, Any, int | None]] = [
    ("msgpack-array32-bomb", raw("/v1/actions/generations", b"\xdd\xff\xff\xff\xff", MSGPACK),
     400),
    ("msgpack-map32-bomb", raw("/v1/actions/generations", b"\xdf\xff\xff\xff\xff", MSGPACK), 400),
    ("msgpack-bin32-bomb", raw("/v1/actions/generations",
                               b"\x81\xa5input\xc6\xff\xff\xff\xff" + b"x" * 64, MSGPACK), 400),
    ("json-wide-array", raw("/v1/videos", WIDE_JSON), 200),  # a seed list: cut to 10
    ("json-many-keys", raw("/v1/streaming/sessions", MANY_KEYS), 400),
    ("png-65535-squared-upload", video_upload(huge_png()), 400),
    ("png-65535-squared-frame", frame(huge_png(), "image/png"), 413),
    ("png-65535-squared-chat", chat_image(huge_png(), "image/png"), None),
    ("jpeg-65500-squared-upload", video_upload(huge_jpeg(), "a.jpg", "image/jpeg"), 400),
    ("jpeg-65500-squared-frame", frame(huge_jpeg(), "image/jpeg"), 413),
    ("video-2000-frames-chat", chat_video(long_video()), None),
    ("video-claiming-2g-frames-chat", chat_video(lying_video()), None),
]
ALL_CASES = [*CASES, *BOMBS]


class FaultLoad(soak_load.Load):
    """The soak's clients plus the vanishing ones and the bombs."""

    weights = {**soak_load.WEIGHTS, **FAULT_WEIGHTS}
    cases = ALL_CASES

    async def vanish_upload(self, rng: random.Random) -> None:
        """Declare a 4 MB body, send part of it, close the socket. The multipart one goes to
        /v1/videos (its `input_reference` upload): Cosmos3 refuses /v1/images/edits before
        reading the body."""
        host, port = self.base.removeprefix("http://").split(":")
        path, kind = rng.choice([("/v1/videos", "multipart/form-data; boundary=b"),
                                 ("/v1/videos", "application/json"),
                                 ("/v1/chat/completions", "application/json")])
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {kind}\r\n"
                         f"Content-Length: {4 * MB}\r\n\r\n".encode())
            writer.write(b"--b\r\n" if "multipart" in kind else b'{"prompt": "')
            writer.write(b"x" * rng.randrange(1, 512 * 1024))
            await writer.drain()
        finally:
            writer.transport.abort()
        self.tally.record("vanish_upload", f"{path} {kind.split(';')[0]}")

    async def vanish_sse(self, rng: random.Random) -> None:
        """Open a streamed chat completion, read its first event, go away."""
        body = {"model": self.chat_model, "max_tokens": 32, "stream": True,
                "messages": [{"role": "user", "content": "Tell a story"}]}
        async with self.http.stream("POST", "/v1/chat/completions", json=body) as answer:
            if answer.status_code != 200:
                await answer.aread()
                self._record("vanish_sse", answer)
                return
            async for line in answer.aiter_lines():
                if line.startswith("data:"):
                    break
        self.tally.record("vanish_sse", "gone_after_first_event")

    async def vanish_ws(self, rng: random.Random) -> None:
        """A WebSocket dropped without a close frame (the TCP connection aborted) mid-session:
        realtime after its first chunk, or live reasoning after sending a frame."""
        realtime = rng.random() < 0.5
        path = "/v1/realtime_video/generate" if realtime else "/v1/streaming/ws"
        async with websockets.connect(f"{self.ws_base}{path}", max_size=None,
                                      open_timeout=30) as ws:
            if realtime:
                await ws.send(msgpack.packb({"type": "init", "prompt": "a castle",
                                             "max_chunks": 3, "seed": rng.randrange(99)}))
                await asyncio.wait_for(ws.recv(), 300)
            else:
                await ws.send(json.dumps({"op": "create", **soak_load.SESSION}))
                if json.loads(await asyncio.wait_for(ws.recv(), 60))["op"] == "created":
                    await ws.send(soak_load.jpeg(rng.randrange(99)))
            ws.transport.abort()
        self.tally.record("vanish_ws", "realtime" if realtime else "streaming")

