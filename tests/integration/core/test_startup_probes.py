"""A real server whose stage loads slowly (the fake reasoner's `fake_load_delay_s`), probed as
a new user would, with a 2 s timeout (api/startup.py): liveness answers at once, readiness 503
`starting` with the stage's progress, every other route 503 with a reason and `Retry-After`;
then the full app takes over. SIGTERM during start-up stops the loading stage."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import psutil
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.support.server import ServerProcess

PROBE_TIMEOUT_S = 2.0
LOAD_DELAY_S = 20.0
CHAT = {"model": "fake-reasoner", "messages": [{"role": "user", "content": "hi"}]}


def _slow_server(workdir: Path) -> ServerProcess:
    return ServerProcess(workdir, {"stages": {
        "generation": {"enabled": False},
        "realtime": {"enabled": False},
        "reasoner": {"backend": "fake", "model_path": str(workdir),
                     "fake_load_delay_s": LOAD_DELAY_S},
    }})


def _first_answer(server: ServerProcess, path: str, timeout_s: float = 60.0) -> httpx.Response:
    """The first answer to `path` once the port is bound (each probe may wait 2 s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert server.proc.poll() is None, server.log()
        try:
            return httpx.get(server.base_url + path, timeout=PROBE_TIMEOUT_S)
        except httpx.ConnectError:  # the process has not bound the port yet
            time.sleep(0.05)
    raise AssertionError(f"no answer on {path} in {timeout_s} s:\n{server.log()}")


def _loading_stage(server: ServerProcess) -> psutil.Process:
    stages = [child for child in psutil.Process(server.proc.pid).children()
              if "worldserve.runtime.stage" in " ".join(child.cmdline())]
    assert len(stages) == 1, stages
    return stages[0]


def test_probes_answer_while_the_stage_loads_then_the_app_takes_over(tmp_path: Path) -> None:
    server = _slow_server(tmp_path)
    try:
        assert _first_answer(server, "/v1/health/live").status_code == 200
        health = httpx.get(f"{server.base_url}/health", timeout=PROBE_TIMEOUT_S)
        assert health.status_code == 503
        body = health.json()
        assert body["status"] == "starting" and set(body["stages"]) == {"reasoner"}
        assert body["stages"]["reasoner"] in ("placing", "waiting", "loading")
        ready = httpx.get(f"{server.base_url}/v1/health/ready", timeout=PROBE_TIMEOUT_S)
        assert ready.status_code == 503 and ready.json()["status"] == "starting"
        assert "reasoner" in ready.json()["progress"]

        chat = httpx.post(f"{server.base_url}/v1/chat/completions", json=CHAT,
                          timeout=PROBE_TIMEOUT_S)
        assert chat.status_code == 503 and int(chat.headers["Retry-After"]) >= 1
        error = chat.json()["error"]
        assert "starting" in error["message"] and "reasoner" in error["message"]
        assert set(error) == {"message", "type", "param", "code"}
        with pytest.raises(InvalidStatus) as refused:
            connect(f"{server.ws_url}/v1/streaming/ws", open_timeout=PROBE_TIMEOUT_S)
        assert refused.value.response.status_code == 503

        server.wait_healthy(timeout_s=LOAD_DELAY_S + 60)
        assert httpx.get(f"{server.base_url}/v1/health/ready").status_code == 200
        assert httpx.post(f"{server.base_url}/v1/chat/completions", json=CHAT,
                          timeout=30).status_code == 200
    finally:
        server.stop()
    assert server.proc.returncode == 0


def test_sigterm_during_start_up_stops_the_loading_stage(tmp_path: Path) -> None:
    server = _slow_server(tmp_path)
    try:
        _first_answer(server, "/v1/health/live")
        deadline = time.monotonic() + 30
        while _first_answer(server, "/health").json()["stages"]["reasoner"] != "loading":
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.1)
        stage = _loading_stage(server)
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=15) == 0, server.log()
        stage.wait(timeout=10)  # the supervisor stopped it (SIGKILL after its grace period)
        assert not list(Path("/tmp").glob(f"worldserve-{server.port}-*"))
        assert "stopping during start-up" in server.log()
    finally:
        server.stop()
