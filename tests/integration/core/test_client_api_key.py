"""`worldserve stream` and `worldserve realtime` against a server started with `--api-key`:
refused (401, exit 1, a message that names the fix) without the key or with a wrong one, served
with it, from the flag or from WORLDSERVE_API_KEY (the variable the server reads too)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.integration.realtime.helpers import fake_config
from tests.support.server import REPO_ROOT, ServerProcess, base_env
from tests.unit.stream_client.synthetic import write_clip

API_KEY = "sekrit-123"
NO_KEY = {"WORLDSERVE_API_KEY": ""}  # the test runner's own environment must not leak a key


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, dev_models_dir: Path
           ) -> Iterator[ServerProcess]:
    """Fake reasoner and fake realtime stages, guarded by --api-key."""
    workdir = tmp_path_factory.mktemp("api-key-clients")
    config = fake_config(workdir)
    config["stages"]["reasoner"] = {"backend": "fake"}
    server = ServerProcess(workdir, config, args=["--api-key", API_KEY], env=NO_KEY)
    server.wait_healthy()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_clip(tmp_path_factory.mktemp("clip") / "clip.mp4", num_frames=10, fps=10)


def client(command: str, *args: str, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "worldserve", command, *args],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=120,
                          env=base_env(**{**NO_KEY, **(env or {})}))


def stream(server: ServerProcess, clip: Path, *args: str, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess:
    return client("stream", "--url", server.base_url, "--video", str(clip), "--fps", "2",
                  "--max-frames", "2", *args, env=env)


def realtime(server: ServerProcess, *args: str, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess:
    return client("realtime", "--url", server.ws_url, "--prompt", "a harbour", "--size",
                  "32x32", "--max-chunks", "1", *args, env=env)


def test_stream_client_needs_the_key(server: ServerProcess, clip: Path) -> None:
    refused = stream(server, clip)
    assert refused.returncode == 1 and "401" in refused.stderr
    assert "pass --api-key or set WORLDSERVE_API_KEY" in refused.stderr
    wrong = stream(server, clip, "--api-key", "not-it")
    assert wrong.returncode == 1 and "the server refused the API key" in wrong.stderr


@pytest.mark.parametrize("transport", ["websocket", "rest"])
def test_stream_client_sends_the_key(server: ServerProcess, clip: Path, transport: str) -> None:
    done = stream(server, clip, "--transport", transport, "--api-key", API_KEY)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "closed after 2 frames" in done.stdout
    from_env = stream(server, clip, "--transport", transport,
                      env={"WORLDSERVE_API_KEY": API_KEY})
    assert from_env.returncode == 0, from_env.stdout + from_env.stderr


def test_realtime_client_needs_the_key(server: ServerProcess) -> None:
    refused = realtime(server)
    assert refused.returncode == 1 and "HTTP 401" in refused.stdout
    assert "pass --api-key or set WORLDSERVE_API_KEY" in refused.stdout
    wrong = realtime(server, "--api-key", "not-it")
    assert wrong.returncode == 1 and "the server refused the API key" in wrong.stdout


def test_realtime_client_sends_the_key(server: ServerProcess) -> None:
    done = realtime(server, "--api-key", API_KEY)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "closed 1000 'generation complete': 1 chunks" in done.stdout
    from_env = realtime(server, env={"WORLDSERVE_API_KEY": API_KEY})
    assert from_env.returncode == 0, from_env.stdout + from_env.stderr
