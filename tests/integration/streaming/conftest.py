"""The shared server on the fake reasoner backend, started once for this folder."""

from __future__ import annotations

from typing import Iterator

import httpx
import pytest

from tests.integration.streaming.support import Sessions, fake_config, start_server
from tests.support.server import ServerProcess

# The main protocol server: default limits; the sixth frame of a session fails as an engine error.
FAIL_ON_FRAME = 5


@pytest.fixture(scope="package")
def fake_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("fake")
    config = fake_config(workdir, fake_fail_on_frame=FAIL_ON_FRAME)
    config["allowed_media_domains"] = ["localhost"]  # chat image URLs served by a test
    server = start_server(workdir, config)
    yield server
    server.stop()


@pytest.fixture
def http(fake_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fake_server.base_url, timeout=30) as client:
        yield client


@pytest.fixture
def sessions(http: httpx.Client) -> Iterator[Sessions]:
    tracker = Sessions(http)
    yield tracker
    tracker.cleanup()
