"""Fixtures for the stream client: a synthetic clip and the client run as a real subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.server import REPO_ROOT, base_env
from tests.unit.stream_client.synthetic import write_clip


@pytest.fixture(scope="session")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 s at 10 fps, 64×48: with --fps 2 every pass yields 6 frames."""
    return write_clip(tmp_path_factory.mktemp("stream-clip") / "clip.mp4", num_frames=30, fps=10)


def client_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "worldserve", "stream", *args]


def run_client(*args: str, timeout_s: float = 120, env: dict[str, str] | None = None
               ) -> subprocess.CompletedProcess:
    """`python -m worldserve stream ARGS` to completion; stdout and stderr captured as text."""
    return subprocess.run(client_command(*args), capture_output=True, text=True, cwd=REPO_ROOT,
                          env=base_env(**(env or {})), timeout=timeout_s)
