"""Busy sessions, frame timeouts and idle expiry (spec sections 5.3, 5.5, 6.1, 7.1).

A server of its own: every fake reply takes 300 ms, frame index 2 is never answered, frames
time out after 1.5 s and sessions expire after 1 s idle (reaper every 0.2 s).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Iterator

import httpx
import pytest

from tests.integration.streaming.support import (
    SESSION_BODY,
    Sessions,
    fake_config,
    image_bytes,
    nim_error,
    start_server,
)
from tests.integration.streaming.test_ws import (
    assert_closed_with,
    assert_error,
    create,
    frame,
    ws_connect,
)
from tests.support.server import ServerProcess

HANG_ON_FRAME = 2
IDLE_S = 1.0


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("slow")
    config = fake_config(workdir, fake_delay_ms=300, fake_hang_on_frame=HANG_ON_FRAME,
                         streaming={"frame_timeout_s": 1.5, "idle_timeout_s": IDLE_S,
                                    "rest_idle_timeout_s": IDLE_S, "reaper_interval_s": 0.2})
    server = start_server(workdir, config)
    yield server
    server.stop()


@pytest.fixture
def sessions(slow_server: ServerProcess) -> Iterator[Sessions]:
    with httpx.Client(base_url=slow_server.base_url, timeout=30) as client:
        tracker = Sessions(client)
        yield tracker
        tracker.cleanup()


def _in_background(fn) -> tuple[threading.Thread, list]:
    out: list = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    return thread, out


def test_second_frame_in_flight_is_409_never_queued(sessions: Sessions) -> None:
    session = sessions.new()
    thread, first = _in_background(lambda: sessions.frame(session, image_bytes()))
    time.sleep(0.1)
    message = nim_error(sessions.frame(session, image_bytes(seed=1)), 409)
    assert message == "session busy: a frame is already being processed"
    thread.join()
    assert first[0].json()["frame_index"] == 0
    assert sessions.frame(session, image_bytes(seed=1)).json()["frame_index"] == 1


def test_frame_timeout_is_504_then_409(sessions: Sessions) -> None:
    session = sessions.new()
    for index in range(HANG_ON_FRAME):
        assert sessions.frame(session, image_bytes(seed=index)).status_code == 200
    started = time.monotonic()
    # the hung frame outlives the idle timeout: a frame in flight is never reaped
    message = nim_error(sessions.frame(session, image_bytes()), 504)
    assert message == "frame processing timed out after 1.5 s; the session was closed"
    assert 1.4 < time.monotonic() - started < 5
    message = nim_error(sessions.frame(session, image_bytes()), 409)
    assert message == "session is no longer usable; create a new session"
    assert sessions.delete(session).json() == {"session_id": session, "frames": HANG_ON_FRAME,
                                               "closed": True}


def test_timed_out_session_releases_its_slot(sessions: Sessions) -> None:
    session = sessions.new()
    for index in range(HANG_ON_FRAME + 1):
        sessions.frame(session, image_bytes(seed=index))
    sessions.new(), sessions.new()  # the dead one no longer holds engine capacity


def test_idle_rest_session_expires_to_404(sessions: Sessions) -> None:
    session = sessions.new()
    time.sleep(IDLE_S + 0.4)
    assert "not found" in nim_error(sessions.frame(session, image_bytes()), 404)
    nim_error(sessions.delete(session), 404)


def test_creation_reaps_idle_sessions_first(sessions: Sessions) -> None:
    sessions.new(), sessions.new()
    time.sleep(IDLE_S + 0.5)
    sessions.new(), sessions.new()


def test_delete_waits_for_the_frame_in_flight(sessions: Sessions) -> None:
    session = sessions.new()
    thread, reply = _in_background(lambda: sessions.frame(session, image_bytes()))
    time.sleep(0.1)
    deleted = sessions.delete(session)
    thread.join()
    assert reply[0].status_code == 200 and reply[0].json()["frame_index"] == 0
    assert deleted.json() == {"session_id": session, "frames": 1, "closed": True}


def test_ws_frame_timeout_is_fatal_504_close_1011(slow_server: ServerProcess) -> None:
    with ws_connect(slow_server) as ws:
        create(ws)
        for index in range(HANG_ON_FRAME):
            assert frame(ws, image_bytes(seed=index))["frame_index"] == index
        assert_error(frame(ws, image_bytes()), 504, True, "timed out after 1.5 s")
        assert_closed_with(ws, 1011)


def test_ws_idle_timeout_is_fatal_408_close_1008(slow_server: ServerProcess) -> None:
    with ws_connect(slow_server) as ws:
        ws.send(json.dumps({"op": "create", **SESSION_BODY}))
        assert json.loads(ws.recv(timeout=10))["op"] == "created"
        started = time.monotonic()
        reply = json.loads(ws.recv(timeout=10))
        assert reply == {"op": "error", "message": "session idle timeout", "code": 408,
                         "fatal": True}
        assert IDLE_S <= time.monotonic() - started < IDLE_S + 2
        assert_closed_with(ws, 1008)
