"""Per-surface readiness and orderly shutdown, against a real server (fake reasoner and fake
realtime backends, no generation stage):

- a crashed realtime stage answers 503 on its own route and shows in /health; the NIM probe
  /v1/health/ready, chat and streaming keep working and the server keeps running;
- on SIGTERM, open streaming and realtime WebSockets get close 1001 `server shutting down`
  (not uvicorn's 1012) and REST streaming sessions are deleted before the process exits.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from tests.support.server import ServerProcess

SESSION_BODY = {"system_prompt": "Describe each frame.", "question": "What is happening?"}
REALTIME = "/v1/realtime_video/generate"


def _config(workdir: Path) -> dict:
    return {"stages": {
        "generation": {"enabled": False},
        "reasoner": {"backend": "fake", "model_path": str(workdir)},
        "realtime": {"enabled": True, "backend": "fake", "model_path": str(workdir)},
    }}


def _start(workdir: Path) -> ServerProcess:
    server = ServerProcess(workdir, _config(workdir))
    try:
        server.wait_healthy(timeout_s=90)
    except BaseException:
        server.stop()
        raise
    return server


def _wait_for(predicate, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def test_crashed_realtime_stage_affects_only_its_route(tmp_path: Path) -> None:
    server = _start(tmp_path)
    try:
        http = httpx.Client(base_url=server.base_url, timeout=10)
        os.kill(server.stage_pids()["realtime"], signal.SIGKILL)
        _wait_for(lambda: http.get("/health").json()["stages"]["realtime"] == "failed")

        health = http.get("/health")
        assert health.status_code == 503
        assert health.json()["stages"] == {"reasoner": "ready", "realtime": "failed"}
        assert http.get("/v1/health/ready").status_code == 200
        with pytest.raises(InvalidStatus) as refused:
            connect(f"{server.ws_url}{REALTIME}", open_timeout=10)
        assert refused.value.response.status_code == 503
        assert b"realtime" in refused.value.response.body
        # the supervisor is restarting it: when it should be back (api/errors.py)
        assert int(refused.value.response.headers["Retry-After"]) >= 1

        created = http.post("/v1/streaming/sessions", json=SESSION_BODY)
        assert created.status_code == 201, created.text
        chat = http.post("/v1/chat/completions", json={
            "model": "fake-reasoner", "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 200, chat.text
        assert server.proc.poll() is None
    finally:
        server.stop()


def _close_code(ws) -> tuple[int, str]:
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            ws.recv(timeout=20)
    assert closed.value.rcvd is not None, "no close frame received"
    return closed.value.rcvd.code, closed.value.rcvd.reason


def test_sigterm_closes_websockets_with_1001_and_deletes_rest_sessions(tmp_path: Path) -> None:
    server = _start(tmp_path)
    try:
        rest = httpx.post(f"{server.base_url}/v1/streaming/sessions", json=SESSION_BODY,
                          timeout=10)
        assert rest.status_code == 201, rest.text
        streaming = connect(f"{server.ws_url}/v1/streaming/ws", open_timeout=10)
        streaming.send(json.dumps({"op": "create", **SESSION_BODY}))
        assert json.loads(streaming.recv(timeout=10))["op"] == "created"
        realtime = connect(f"{server.ws_url}{REALTIME}", open_timeout=10, max_size=None)

        server.proc.send_signal(signal.SIGTERM)
        assert _close_code(streaming) == (1001, "server shutting down")
        assert _close_code(realtime) == (1001, "server shutting down")
        assert server.proc.wait(timeout=30) == 0
        log = server.log()
        assert "deleted 2 streaming session(s) on shutdown" in log or (
            "deleted 1 streaming session(s) on shutdown" in log), log[-3000:]
        assert "closed 2 WebSocket(s) with 1001" in log, log[-3000:]
    finally:
        server.stop()
