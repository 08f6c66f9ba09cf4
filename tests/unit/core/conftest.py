"""Fixtures of the cli tests (test_cli_flags.py, test_cli_settings.py)."""

from __future__ import annotations

from typing import Any

import pytest

from worldserve import cli
from worldserve.config import ServerConfig


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[ServerConfig]:
    """Stop `serve` at the boundary: record the config it would start the server with."""
    seen: list[ServerConfig] = []

    async def fake_serve(cfg: ServerConfig, key: Any) -> int:
        seen.append(cfg)
        return 0

    monkeypatch.setattr(cli, "_serve", fake_serve)
    monkeypatch.setattr(cli, "_fill_dev_model_paths", lambda cfg: cfg)
    return seen
