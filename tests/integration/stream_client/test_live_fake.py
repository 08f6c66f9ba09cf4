"""`worldserve stream` as a subprocess against a live worldserve with the `fake` reasoner."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.integration.stream_client.conftest import client_command, run_client
from tests.support.server import REPO_ROOT, ServerProcess, base_env

MAX_SESSIONS = 2
CONFIG = {"stages": {"generation": {"enabled": False},
                     # a small per-frame delay so that Ctrl+C lands while a frame is in flight
                     "reasoner": {"backend": "fake", "fake_delay_ms": 50,
                                  "streaming": {"max_sessions": MAX_SESSIONS}}}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, dev_models_dir: Path
           ) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path_factory.mktemp("stream-fake"), CONFIG)
    server.wait_healthy()
    yield server
    server.stop()


def live_sessions(server: ServerProcess) -> int:
    stats = httpx.get(f"{server.base_url}/admin/stats", timeout=10).json()
    return stats["stages"]["reasoner"]["sessions"]


@pytest.fixture
def url(server: ServerProcess) -> Iterator[str]:
    """The server's URL; every test must leave no session behind."""
    yield server.base_url
    assert live_sessions(server) == 0, server.log()[-3000:]


def frame_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("frame ")]


@pytest.mark.parametrize(("transport", "frame_format"), [
    ("websocket", "binary"), ("websocket", "base64"), ("rest", "base64"), ("rest", "binary")])
def test_both_transports_both_formats(url: str, clip: Path, transport: str,
                                      frame_format: str) -> None:
    done = run_client("--url", url, "--video", str(clip), "--fps", "2", "--max-frames", "4",
                      "--transport", transport, "--frame-format", frame_format)
    assert done.returncode == 0, done.stderr
    lines = frame_lines(done.stdout)
    assert [line[:11] for line in lines] == [f"frame {i:>4}:" for i in range(4)]
    assert all(line.endswith("s)") for line in lines)  # worldserve reports latency_s
    assert "closed after 4 frames" in done.stdout
    assert done.stdout.splitlines()[-1].startswith("summary: 4 frames; mean latency ")
    assert any(line.startswith("session sess-") for line in done.stdout.splitlines()[:2])
    if transport == "websocket":
        assert f"connecting to ws{url[4:]}/v1/streaming/ws" in done.stdout


def test_environment_url_loop_quiet_and_eviction_counts(url: str, clip: Path) -> None:
    """6 frames per pass, 14 with --loop; a window of 2 makes the server evict."""
    done = run_client("--video", str(clip), "--fps", "2", "--max-frames", "14", "--loop",
                      "--quiet", "--max-video-segments", "2", env={"WORLDSERVE_URL": url})
    assert done.returncode == 0, done.stderr
    assert [line[:11] for line in frame_lines(done.stdout)] == ["frame    0:", "frame   10:"]
    assert "closed after 14 frames" in done.stdout
    summary = done.stdout.splitlines()[-1]
    assert summary.startswith("summary: 14 frames;")
    assert "evicted segments" in summary and "evicted segments 0," not in summary


def test_json_lines(url: str, clip: Path) -> None:
    done = run_client("--url", url, "--video", str(clip), "--fps", "2", "--json",
                      "--transport", "rest")
    assert done.returncode == 0, done.stderr
    replies = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["frame_index"] for r in replies] == list(range(6))
    assert all(isinstance(r["text"], str) and r["finish_reason"] in ("stop", "length")
               for r in replies)
    assert "closed after 6 frames" in done.stderr and "summary: 6 frames" in done.stderr


def test_dynamo_mode(url: str, clip: Path) -> None:
    done = run_client("--url", url, "--video", str(clip), "--fps", "2", "--max-frames", "3",
                      "--backend", "dynamo")
    assert done.returncode == 0, done.stderr
    assert len(frame_lines(done.stdout)) == 3 and "warning" not in done.stderr


def test_quiet_progress_bar_on_a_terminal(url: str, clip: Path) -> None:
    leader, follower = pty.openpty()
    try:
        proc = subprocess.run(client_command("--url", url, "--video", str(clip), "--fps", "2",
                                             "--max-frames", "5", "--quiet"),
                              stdout=subprocess.PIPE, stderr=follower, text=True, cwd=REPO_ROOT,
                              env=base_env(), timeout=60)
        os.close(follower)
        follower = -1
        terminal = _drain(leader)
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    assert proc.returncode == 0
    assert "1/5 frames" in terminal and "5/5 frames" in terminal
    assert "1/5" not in proc.stdout  # the bar never goes to stdout


def _drain(fd: int) -> str:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO once the other side is closed and drained
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def _as_from_a_terminal() -> None:
    """The client's SIGINT as a shell gives it: default and unblocked. An ignored or blocked
    SIGINT is inherited through exec, and this pytest process may have either from what ran
    in it before (in-process engines and Ray drivers), which the client must not see."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])


@pytest.mark.parametrize("transport", ["websocket", "rest"])
def test_ctrl_c_deletes_the_session(server: ServerProcess, url: str, clip: Path,
                                    transport: str) -> None:
    proc = subprocess.Popen(client_command("--url", url, "--video", str(clip), "--fps", "2",
                                           "--loop", "--max-frames", "100000",
                                           "--transport", transport),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO_ROOT, env=base_env(), preexec_fn=_as_from_a_terminal)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # wait until the stream is flowing
            if line.startswith("frame    2:"):
                break
        assert live_sessions(server) == 1
        time.sleep(0.02)  # most of a frame's time is the server's delay: land mid-frame
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr and "closed after" in stdout
    assert live_sessions(server) == 0
    # capacity is back: max_sessions fresh sessions are admitted
    created = [httpx.post(f"{url}/v1/streaming/sessions", json={"system_prompt": "s"}, timeout=10)
               for _ in range(MAX_SESSIONS)]
    assert [r.status_code for r in created] == [201] * MAX_SESSIONS
    for response in created:
        httpx.delete(f"{url}/v1/streaming/sessions/{response.json()['session_id']}", timeout=10)


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_nim_cookbook_names(url: str, clip: Path, how: str) -> None:
    """--nim-url / $NIM_URL and --backend nim, as the cookbook writes them (a flag wins over a
    $NIM_URL that points nowhere); REST binary frames still work against worldserve."""
    args = ["--nim-url", url] if how == "flag" else []
    env = {"NIM_URL": url if how == "environment" else "http://127.0.0.1:9",
           "WORLDSERVE_URL": ""}  # empty = unset (it would win over $NIM_URL)
    done = run_client(*args, "--backend", "nim", "--video", str(clip), "--fps", "2",
                      "--max-frames", "2", "--transport", "rest", "--frame-format", "binary",
                      env=env)
    assert done.returncode == 0, done.stderr
    assert "closed after 2 frames" in done.stdout
