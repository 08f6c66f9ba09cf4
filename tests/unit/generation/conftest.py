from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_wan_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.unit.generation.tiny_wan import build_tiny_wan

    return build_tiny_wan(tmp_path_factory.mktemp("tiny-wan") / "generation")
