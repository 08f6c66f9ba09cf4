"""WebSocket floods and hostile messages on /v1/streaming/ws (and the realtime socket when the
realtime surface is present). Every case ends with the documented close code or a live
session, and the server alive."""

from __future__ import annotations

import json
import time

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.integration.hostile.conftest import PNG, assert_alive, rss_kb
from tests.support.server import ServerProcess

CREATE = {"op": "create", "system_prompt": "describe", "frame_format": "binary"}


def drain_until_closed(ws, timeout_s: float = 30.0) -> list[str | bytes]:
    """Every message until the server closes; returns them (the close code is on `ws`)."""
    received: list[str | bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            received.append(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
    except ConnectionClosed:
        return received
    raise AssertionError("the server did not close the connection")


def close_code(ws) -> int | None:
    return ws.close_code


@pytest.mark.parametrize("first", [b"\x00" * 1000, "not json", "[1, 2]", '{"op": "frame"}',
                                   "[" * 10_000 + "]" * 10_000,
                                   json.dumps({**CREATE, "system_prompt": "x" * (1 << 20)})])
def test_messages_before_create_are_fatal_1008(strict: ServerProcess, first) -> None:
    with connect(strict.ws_url + "/v1/streaming/ws", max_size=None) as ws:
        for _ in range(200):  # a flood: only the first is read, the rest die with the socket
            try:
                ws.send(first)
            except ConnectionClosed:
                break
        messages = drain_until_closed(ws)
    assert close_code(ws) == 1008
    error = json.loads(messages[0])
    assert error["op"] == "error" and error["fatal"] is True and error["code"] == 400


def test_oversized_message_closes_1009(strict: ServerProcess) -> None:
    with connect(strict.ws_url + "/v1/streaming/ws", max_size=None) as ws:
        ws.send(json.dumps(CREATE))
        assert json.loads(ws.recv(timeout=30))["op"] == "created"
        try:
            ws.send(b"\xff" * (17 * 1024 * 1024))
        except ConnectionClosed:
            pass
        drain_until_closed(ws)
    assert close_code(ws) == 1009


def test_non_fatal_flood_keeps_the_session(strict: ServerProcess) -> None:
    """5,000 bad messages as fast as the client can send: each gets a non-fatal error (the
    server reads in order, bounded by the WebSocket stack's queue: the client is slowed down,
    nothing piles up), then a real frame and a delete still work."""
    before = rss_kb(strict.proc.pid)
    count = 5000
    with connect(strict.ws_url + "/v1/streaming/ws", max_size=None) as ws:
        ws.send(json.dumps(CREATE))
        assert json.loads(ws.recv(timeout=30))["op"] == "created"
        bad = [json.dumps({"op": "nope"}), "not json", json.dumps({"op": "frame"}), "[]",
               json.dumps({"op": "create"}), "[" * 5000 + "]" * 5000]
        for i in range(count):
            ws.send(bad[i % len(bad)])
        for _ in range(count):
            reply = json.loads(ws.recv(timeout=60))
            assert reply["op"] == "error" and reply["fatal"] is False and reply["code"] == 400
        ws.send(PNG)
        assert json.loads(ws.recv(timeout=30))["op"] == "frame"
        ws.send(json.dumps({"op": "delete"}))
        assert json.loads(ws.recv(timeout=30))["op"] == "closed"
        drain_until_closed(ws)
    assert close_code(ws) == 1000
    assert rss_kb(strict.proc.pid) - before < 64 * 1024


def test_server_survived(strict: ServerProcess) -> None:
    assert_alive(strict)
