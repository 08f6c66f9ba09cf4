"""Live servers for the generation surface: the tiny Wan pipeline (+ action head), reasoner off."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.support.server import ServerProcess


@pytest.fixture(scope="session")
def gen_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.unit.generation.tiny_wan import build_tiny_wan

    return build_tiny_wan(tmp_path_factory.mktemp("tiny-wan") / "generation")


def gen_config(model_dir: Path, **generation: Any) -> dict[str, Any]:
    return {
        "stages": {
            "reasoner": {"enabled": False},
            "generation": {"model_path": str(model_dir), **generation},
        }
    }


def start_server(
    workdir: Path,
    model_dir: Path,
    args: list[str] | None = None,
    wait: bool = True,
    **generation: Any,
) -> ServerProcess:
    server = ServerProcess(workdir, gen_config(model_dir, **generation), args)
    if wait:
        server.wait_healthy()
    return server


@pytest.fixture(scope="module")
def gen_server(
    tmp_path_factory: pytest.TempPathFactory, gen_model_dir: Path
) -> Iterator[ServerProcess]:
    server = start_server(tmp_path_factory.mktemp("gen"), gen_model_dir)
    yield server
    server.stop()
