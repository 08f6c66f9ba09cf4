"""Fixtures for the SANA-WM realtime tests: the tiny pipeline and refiner, built in memory."""

from __future__ import annotations

import pytest

from tests.support.images import random_png
from tests.support.torch_threads import one_torch_thread  # noqa: F401
from tests.unit.realtime.inprocess_ws import clients  # noqa: F401
from worldserve.models.sana_wm.dev import build_pipeline, build_refiner
from worldserve.models.sana_wm.runner import SanaWMRunner


@pytest.fixture(scope="session")
def sana_pipe():
    return build_pipeline(0)


@pytest.fixture(scope="session")
def sana_refiner():
    return build_refiner(0)


@pytest.fixture(scope="session")
def first_frame() -> bytes:
    """A 80x48 PNG (not the session size: the pipeline resizes and crops it)."""
    return random_png(80, 48)


@pytest.fixture
def runner(sana_pipe):
    return SanaWMRunner(sana_pipe)


@pytest.fixture
def refined_runner(sana_pipe, sana_refiner):
    return SanaWMRunner(sana_pipe, sana_refiner)
