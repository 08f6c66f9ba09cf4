"""Shared fixtures: the dev checkpoints and real server processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.server import ServerProcess, base_env

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def dev_models_dir() -> Path:
    """The dev checkpoints, built once (cached across runs like `make serve` does)."""
    from worldserve import envs

    root = envs.dev_models_dir()
    subprocess.run(
        [sys.executable, "-m", "worldserve", "dev-models", "build", str(root)],
        check=True,
        env=base_env(),
    )
    return root


@pytest.fixture
def server_factory(tmp_path: Path, dev_models_dir: Path) -> Iterator:
    """`start(config=None, args=None, env=None, wait=True)` -> a running ServerProcess."""
    servers: list[ServerProcess] = []

    def start(
        config: dict | None = None,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
        wait: bool = True,
    ) -> ServerProcess:
        server = ServerProcess(tmp_path, config, args, env)
        servers.append(server)
        if wait:
            server.wait_healthy()
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def live_server(
    tmp_path_factory: pytest.TempPathFactory, dev_models_dir: Path
) -> Iterator[ServerProcess]:
    """One default server shared by a test module."""
    server = ServerProcess(tmp_path_factory.mktemp("live"))
    server.wait_healthy()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def cosmos3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny seeded Cosmos3 generator (sound and action heads), built once per session."""
    from worldserve.models.cosmos3.dev import build_cosmos3

    target = tmp_path_factory.mktemp("cosmos3")
    build_cosmos3(target, 0)
    # The dev marker: the engine then uses the small dev sampling defaults (warmup included).
    (target / "worldserve_dev.json").write_text('{"name": "cosmos3-test"}')
    return target
