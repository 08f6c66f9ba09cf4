"""`/v1/streaming/ws` against a live server on the fake backend (spec section 8)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.integration.streaming.conftest import FAIL_ON_FRAME
from tests.integration.streaming.support import SESSION_BODY, Sessions, b64, image_bytes


def ws_connect(server) -> ClientConnection:
    return connect(f"{server.ws_url}/v1/streaming/ws", max_size=None, open_timeout=10)


def send_json(ws: ClientConnection, obj: Any) -> dict[str, Any]:
    ws.send(json.dumps(obj))
    return json.loads(ws.recv(timeout=10))


def create(ws: ClientConnection, **overrides: Any) -> dict[str, Any]:
    return send_json(ws, {"op": "create", **SESSION_BODY, **overrides})


def frame(ws: ClientConnection, data: bytes) -> dict[str, Any]:
    ws.send(data)
    return json.loads(ws.recv(timeout=10))


def assert_error(reply: dict[str, Any], code: int, fatal: bool, text: str = "") -> None:
    assert set(reply) == {"op", "message", "code", "fatal"}, reply
    assert (reply["op"], reply["code"], reply["fatal"]) == ("error", code, fatal), reply
    assert text in reply["message"]


def assert_closed_with(ws: ClientConnection, code: int) -> None:
    with pytest.raises(ConnectionClosed):
        ws.recv(timeout=10)
    assert ws.close_code == code


def test_binary_session_round_trip(fake_server) -> None:
    with ws_connect(fake_server) as ws:
        created = create(ws, retention={"max_video_segments": 4})
        assert created["op"] == "created"
        assert created["session_id"].startswith("sess-")
        assert created["frame_format"] == "binary"
        assert created["model"] == "fake-reasoner"
        assert created["retention"]["max_video_segments"] == 4
        assert created["sampling"]["max_tokens"] == 24
        for index in range(3):
            reply = frame(ws, image_bytes(seed=index))
            assert reply["op"] == "frame" and reply["frame_index"] == index
            assert reply["text"]
        closed = send_json(ws, {"op": "delete"})
        assert closed == {"op": "closed", "session_id": created["session_id"], "frames": 3,
                          "closed": True}
        assert_closed_with(ws, 1000)


def test_base64_session_and_op_may_be_omitted(fake_server) -> None:
    with ws_connect(fake_server) as ws:
        created = send_json(ws, {**SESSION_BODY, "frame_format": "base64"})
        assert created["op"] == "created" and created["frame_format"] == "base64"
        png = image_bytes("PNG")
        for image_b64 in (b64(png), "data:image/png;base64," + b64(png)):
            assert send_json(ws, {"op": "frame", "image_b64": image_b64})["op"] == "frame"
        assert send_json(ws, {"op": "delete"})["frames"] == 2


def test_same_frames_give_the_same_replies_on_both_transports(fake_server,
                                                              sessions: Sessions) -> None:
    frames = [image_bytes(seed=i) for i in range(3)]
    session = sessions.new()
    rest = [sessions.frame(session, f).json()["text"] for f in frames]
    with ws_connect(fake_server) as ws:
        create(ws)
        assert [frame(ws, f)["text"] for f in frames] == rest


def test_non_fatal_errors_keep_the_session(fake_server) -> None:
    with ws_connect(fake_server) as ws:
        create(ws)
        assert frame(ws, image_bytes())["frame_index"] == 0
        assert_error(send_json(ws, {"op": "update"}), 400, False,
                     "unknown op 'update'; expected 'frame' or 'delete'")
        assert_error(send_json(ws, {"op": "create", **SESSION_BODY}), 400, False,
                     "session already created")
        assert_error(send_json(ws, {"op": "frame", "image_b64": b64(image_bytes())}), 400, False,
                     "frame format mismatch")
        ws.send("{not json")
        assert_error(json.loads(ws.recv(timeout=10)), 400, False, "not valid JSON")
        assert_error(send_json(ws, [1]), 400, False, "JSON object")
        assert_error(frame(ws, image_bytes("GIF")), 400, False, "JPEG or PNG")
        assert_error(frame(ws, b"\x89PNG\r\n\x1a\n garbage"), 400, False, "invalid PNG image")
        assert_error(frame(ws, image_bytes("PNG", size=(4096, 2048))), 413, False, "pixels")
        assert_error(frame(ws, b"\xff\xd8\xff" + bytes(9 * 1024 * 1024)), 413, False, "8 MiB")
        assert frame(ws, image_bytes())["frame_index"] == 1
        assert send_json(ws, {"op": "delete"})["frames"] == 2


def test_format_mismatch_in_a_base64_session(fake_server) -> None:
    with ws_connect(fake_server) as ws:
        create(ws, frame_format="base64")
        assert_error(frame(ws, image_bytes()), 400, False, "this session uses base64 frames")
        assert_error(send_json(ws, {"op": "frame", "image_b64": "%%%"}), 400, False, "base64")
        assert send_json(ws, {"op": "frame", "image_b64": b64(image_bytes())})["frame_index"] == 0


@pytest.mark.parametrize("first, code, text", [
    ("{not json", 400, "not valid JSON"),
    (json.dumps([1, 2]), 400, "JSON object"),
    (json.dumps({"op": "frame", "image_b64": "x"}), 400, "got op 'frame'"),
    (b"\xff\xd8\xff", 400, "not binary data"),
    (json.dumps({"op": "create"}), 400, "system_prompt"),
    (json.dumps({**SESSION_BODY, "frame_format": "jpeg"}), 400, "frame_format"),
    (json.dumps({**SESSION_BODY, "retention": {"bogus": 1}}), 400, "unknown retention field"),
    (json.dumps({**SESSION_BODY, "sampling": {"guided_choice": ["a"], "guided_regex": "a"}}),
     400, "at most one of"),
    (json.dumps({**SESSION_BODY, "model": "other"}), 404, "unknown model 'other'"),
])
def test_invalid_first_message_is_fatal(fake_server, first: str | bytes, code: int,
                                        text: str) -> None:
    with ws_connect(fake_server) as ws:
        ws.send(first)
        assert_error(json.loads(ws.recv(timeout=10)), code, True, text)
        assert_closed_with(ws, 1008)


def test_capacity_is_fatal_503_and_shared_with_rest(fake_server, sessions: Sessions) -> None:
    sessions.new(), sessions.new()
    with ws_connect(fake_server) as ws:
        assert_error(create(ws), 503, True, "session slots exhausted (2/2)")
        assert_closed_with(ws, 1008)


def test_disconnect_releases_the_session(fake_server, sessions: Sessions) -> None:
    with ws_connect(fake_server) as ws:
        create(ws)
        frame(ws, image_bytes())
    with ws_connect(fake_server) as ws:
        create(ws)
    # both WebSocket sessions are gone: the two slots are free for REST
    sessions.new(), sessions.new()


def test_engine_failure_is_fatal_500_close_1011(fake_server) -> None:
    with ws_connect(fake_server) as ws:
        create(ws)
        for index in range(FAIL_ON_FRAME):
            assert frame(ws, image_bytes(seed=index))["frame_index"] == index
        assert_error(frame(ws, image_bytes()), 500, True, "fake engine failure")
        assert_closed_with(ws, 1011)


def test_websocket_is_not_in_the_openapi_document(fake_server) -> None:
    paths = httpx.get(f"{fake_server.base_url}/openapi.json").json()["paths"]
    assert "/v1/streaming/ws" not in paths
    assert "/v1/streaming/sessions" in paths


def test_message_above_16_mib_is_closed_1009_by_the_stack(fake_server) -> None:
    with ws_connect(fake_server) as ws:
        create(ws)
        try:
            ws.send(bytes(17 * 1024 * 1024))
        except ConnectionClosed:
            pass
        assert_closed_with(ws, 1009)
