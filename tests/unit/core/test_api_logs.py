"""uvicorn's WebSocket lines under `--no-access-log`, and its spurious ERROR after a WebSocket
denial response (api/logs.py), on uvicorn's own logger."""

from __future__ import annotations

import logging

import pytest

from worldserve.api.logs import UVICORN_LOGGER, UvicornNoise

ACCEPTED = '127.0.0.1:5000 - "WebSocket /v1/streaming/ws" [accepted]'
DENIED = '127.0.0.1:5000 - "WebSocket /v1/realtime_video/generate" 503'
SPURIOUS = "ASGI callable returned without completing handshake."


def kept(noise: UvicornNoise, message: str) -> bool:
    record = logging.LogRecord(UVICORN_LOGGER, logging.INFO, __file__, 1, message, None, None)
    return noise.filter(record)


@pytest.mark.parametrize("access_log", [True, False])
def test_websocket_handshakes_follow_the_access_log_setting(access_log: bool) -> None:
    noise = UvicornNoise(access_log)
    for line in (ACCEPTED, "connection open", "connection closed"):
        assert kept(noise, line) is access_log
    assert kept(noise, "Started server process [1]")
    assert kept(noise, "Exception in ASGI application\n")


def test_only_the_error_after_a_denial_is_dropped() -> None:
    noise = UvicornNoise(access_log=True)
    assert kept(noise, SPURIOUS)  # no denial before it: a real bug, kept
    assert kept(noise, DENIED)
    assert not kept(noise, SPURIOUS)
    assert kept(noise, SPURIOUS)  # one denial, one line dropped
