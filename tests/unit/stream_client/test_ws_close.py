"""WebSocketTransport.close against a real WebSocket server: `closed after` always has a count
(spec §14.6: the reply's `frames`, else the local count), also when the server drops the
connection instead of answering the delete (a Ctrl+C that cut a message in half)."""

from __future__ import annotations

import json
import threading
from typing import Iterator

import pytest
from websockets.sync.server import ServerConnection, serve

from worldserve.clients.stream_transports import WebSocketTransport


def _server(on_delete: str):
    def handler(ws: ServerConnection) -> None:
        frames = 0
        for message in ws:
            if isinstance(message, bytes):
                frames += 1
                ws.send(json.dumps({"op": "frame", "frame_index": frames - 1, "text": "x"}))
                continue
            op = json.loads(message)["op"]
            if op == "create":
                ws.send(json.dumps({"op": "created", "session_id": "s"}))
            elif op == "delete" and on_delete == "reply":
                ws.send(json.dumps({"op": "closed", "frames": frames}))
            elif op == "delete" and on_delete == "reply-without-count":
                ws.send(json.dumps({"op": "closed"}))
            elif op == "delete":
                ws.close(1002, "broken frame")
                return
    return handler


@pytest.fixture(params=["reply", "reply-without-count", "drop"])
def server_url(request) -> Iterator[tuple[str, str]]:
    with serve(_server(request.param), "127.0.0.1", 0) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield f"http://127.0.0.1:{server.socket.getsockname()[1]}", request.param
        server.shutdown()


def test_close_reports_a_frame_count_however_the_server_ends(server_url) -> None:
    url, on_delete = server_url
    transport = WebSocketTransport(url, "binary")
    transport.open({})
    for _ in range(3):
        assert transport.send(b"jpeg")["op"] == "frame"
    assert transport.close() == 3, on_delete
