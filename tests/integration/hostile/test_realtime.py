"""Hostile input on the realtime WebSocket (msgpack): first_frame under the media policy,
forbidden fields, huge prompts, deep maps, floods of events. Expected outcome for each case;
the server alive afterwards."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import msgpack
import pytest
import websockets

from tests.integration.hostile.conftest import PNG, assert_alive, rss_kb
from tests.integration.hostile.test_bodies import BOMB
from tests.support.server import ServerProcess

ENDPOINT = "/v1/realtime_video/generate"
INIT = {"type": "init", "prompt": "a corridor", "size": "64x64", "max_chunks": 2}


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


async def first_reply(
    url: str, messages: list[bytes | str], timeout_s: float = 30
) -> tuple[dict[str, Any] | None, int | None]:
    """Send the messages; return the first msgpack map the server sends and the close code
    (None while the socket is still open after that map)."""
    async with websockets.connect(url + ENDPOINT, max_size=None) as ws:
        for message in messages:
            await ws.send(message)
        try:
            first = msgpack.unpackb(await asyncio.wait_for(ws.recv(), timeout_s), raw=False)
        except websockets.ConnectionClosed as closed:
            return None, closed.rcvd.code if closed.rcvd else None
        return first, None


def init_with(**fields: Any) -> Callable[[dict[str, Any]], bytes]:
    return lambda ctx: pack(
        {**INIT, **{k: (v(ctx) if callable(v) else v) for k, v in fields.items()}}
    )


# (case, server, init builder, outcome): "chunk" = the session starts (a frame batch header
# arrives first), "invalid" = error `invalid generate request` and the server keeps waiting.
CASES: list[tuple[str, str, Callable[[dict[str, Any]], bytes], str]] = [
    ("first-frame-bytes", "strict", init_with(first_frame=PNG), "chunk"),
    (
        "first-frame-data-url",
        "strict",
        init_with(first_frame="data:image/png;base64," + base64.b64encode(PNG).decode()),
        "chunk",
    ),
    (
        "first-frame-listed-origin",
        "strict",
        init_with(first_frame=lambda c: c["origin"] + "/img.png"),
        "chunk",
    ),
    (
        "first-frame-local-inside",
        "strict",
        init_with(first_frame=lambda c: str(c["media"] / "ok.png")),
        "chunk",
    ),
    (
        "first-frame-traversal",
        "strict",
        init_with(first_frame=lambda c: str(c["media"] / ".." / "secret.png")),
        "invalid",
    ),
    (
        "first-frame-symlink-escape",
        "strict",
        init_with(first_frame=lambda c: str(c["media"] / "escape.png")),
        "invalid",
    ),
    (
        "first-frame-file-url-outside",
        "strict",
        init_with(first_frame="file:///etc/passwd"),
        "invalid",
    ),
    (
        "first-frame-redirect-unlisted",
        "strict",
        init_with(first_frame=lambda c: c["origin"] + "/to-localhost"),
        "invalid",
    ),
    ("first-frame-bomb", "strict", init_with(first_frame=BOMB), "invalid"),
    (
        "first-frame-not-an-image",
        "strict",
        init_with(first_frame=b"GIF89a but not really"),
        "invalid",
    ),
    (
        "first-frame-local-bare",
        "bare",
        init_with(first_frame=lambda c: str(c["media"] / "ok.png")),
        "invalid",
    ),
    (
        "first-frame-loopback-bare",
        "bare",
        init_with(first_frame=lambda c: c["origin"] + "/img.png"),
        "invalid",
    ),
    (
        "forbidden-nested",
        "strict",
        init_with(condition_inputs={"extra": {"deep": [{"lora_path": "/x"}]}}),
        "invalid",
    ),
    (
        "forbidden-in-json-string",
        "strict",
        init_with(extra_params=json.dumps({"output_path": "/tmp/x"})),
        "invalid",
    ),
    (
        "intrinsics-path",
        "strict",
        init_with(condition_inputs={"intrinsics_path": "/etc/passwd"}),
        "invalid",
    ),
    ("megabyte-prompt", "strict", init_with(prompt="x" * (1 << 20)), "invalid"),
    ("deep-map", "strict", lambda c: b"\x81\xa1a" * 5000 + b"\xc0", "invalid"),
    ("not-msgpack", "strict", lambda c: b"\xc1\xc1\xc1", "invalid"),
    ("text-message", "strict", lambda c: "hello", "invalid"),
]


def test_the_hostile_server_offers_the_realtime_route(strict: ServerProcess) -> None:
    """Every case here needs the realtime route: without it the suite fails, never skips."""
    offered = httpx.get(strict.base_url + "/web/surfaces", timeout=10).json()
    assert offered["realtime"] is True, offered


@pytest.fixture(scope="module")
def ctx(origin: str, media_dir: Path) -> dict[str, Any]:
    return {"origin": origin, "media": media_dir}


@pytest.mark.parametrize("case,server,build,outcome", CASES, ids=[c[0] for c in CASES])
def test_init(
    strict: ServerProcess,
    bare: ServerProcess,
    ctx: dict[str, Any],
    case: str,
    server: str,
    build: Callable,
    outcome: str,
) -> None:
    target = strict if server == "strict" else bare
    reply, code = asyncio.run(first_reply(target.ws_url, [build(ctx)]))
    assert reply is not None, (case, code)
    if outcome == "chunk":
        assert reply["type"] in ("frame_batch", "frame_batch_header"), (case, reply)
    else:
        assert reply["type"] == "error" and reply["content"] == "invalid generate request", (
            case,
            reply,
        )


def test_invalid_init_flood_closes_1008(strict: ServerProcess) -> None:
    async def run() -> int | None:
        async with websockets.connect(strict.ws_url + ENDPOINT, max_size=None) as ws:
            for _ in range(500):
                try:
                    await ws.send(pack({"type": "event", "kind": "heartbeat"}))
                except websockets.ConnectionClosed:
                    break
            try:
                while True:
                    await asyncio.wait_for(ws.recv(), 30)
            except websockets.ConnectionClosed as closed:
                return closed.rcvd.code if closed.rcvd else None

    assert asyncio.run(run()) == 1008


def test_oversized_message_closes_1009(strict: ServerProcess) -> None:
    reply, code = asyncio.run(first_reply(strict.ws_url, [b"\x00" * (17 * 1024 * 1024)]))
    assert reply is None and code == 1009


def flood_session(url: str, init: dict[str, Any],
                  num_chunks: int = 12) -> tuple[int, int, int | None, float]:
    """A client sends 10,000 events (valid camera states, prompts, junk) as fast as it can
    while reading a session of `num_chunks` chunks. Returns (chunk_stats received, errors
    received, close code, seconds spent sending)."""
    events = [
        pack(
            {
                "type": "event",
                "kind": "camera_actions",
                "payload": {
                    "mode": "state",
                    "transitions": [{"actions": ["w"], "client_ts_ms": 1}],
                },
            }
        ),
        pack({"type": "event", "kind": "prompt", "payload": "a new corridor"}),
        pack({"type": "event", "kind": "heartbeat"}),
        pack({"type": "event", "kind": "nope"}),
        b"\xc1",
    ]

    async def run() -> tuple[int, int, int | None, float]:
        async with websockets.connect(url + ENDPOINT, max_size=None) as ws:
            await ws.send(pack({**init, "max_chunks": num_chunks}))
            received = {"chunks": 0, "errors": 0}

            async def reader() -> int | None:
                try:
                    while True:
                        message = await asyncio.wait_for(ws.recv(), 60)
                        try:
                            decoded = msgpack.unpackb(message, raw=False)
                        except (ValueError, msgpack.UnpackException):
                            continue
                        kind = decoded.get("type") if isinstance(decoded, dict) else None
                        received["chunks"] += kind == "chunk_stats"
                        received["errors"] += kind == "error"
                except websockets.ConnectionClosed as closed:
                    return closed.rcvd.code if closed.rcvd else None

            reading = asyncio.create_task(reader())
            started = time.monotonic()
            for i in range(10_000):
                await ws.send(events[i % len(events)])
            send_s = time.monotonic() - started
            code = await reading
            return received["chunks"], received["errors"], code, send_s

    return asyncio.run(run())


def test_10000_event_flood_is_answered_in_full_with_bounded_memory(strict: ServerProcess) -> None:
    """10,000 events sent without pause during one session: the session survives (every chunk
    comes, then close 1000 at max_chunks), each invalid event gets its error, and the api's
    memory grows by less than 64 MiB (control queues are bounded: 512 transitions, latest
    prompt). The sending rate is printed, not asserted: timings are not test assertions."""
    before = rss_kb(strict.proc.pid)
    chunks, errors, code, send_s = flood_session(strict.ws_url, INIT)
    assert code == 1000 and chunks == 12, (code, chunks, errors)
    assert errors == 4000  # every invalid event is answered, none is dropped silently
    assert rss_kb(strict.proc.pid) - before < 64 * 1024
    print(f"10,000 events sent in {send_s:.2f} s")


def test_server_survived(strict: ServerProcess, bare: ServerProcess) -> None:
    assert_alive(strict)
    assert_alive(bare)
