"""Fixtures for the Cosmos3 world-session tests: the tiny Cosmos3 pipeline (action heads),
loaded once from the session's dev directory."""

from __future__ import annotations

import pytest

from tests.support.images import random_png
from tests.support.torch_threads import one_torch_thread  # noqa: F401
from tests.unit.realtime.inprocess_ws import clients  # noqa: F401
from worldserve.models.cosmos3.world import Cosmos3World


@pytest.fixture(scope="session")
def world_runner(cosmos3_dir) -> Cosmos3World:
    from worldserve.models import registry

    return registry.load_runner("realtime", cosmos3_dir)


@pytest.fixture(scope="session")
def first_frame() -> bytes:
    """An 80x48 PNG (not the session size: the runner fits it to the session)."""
    return random_png(80, 48)
