"""One fake-backend realtime server shared by the realtime integration tests."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.integration.realtime.helpers import start_fake_server
from tests.support.server import ServerProcess

LOST_SESSION_SEED = 666


@pytest.fixture(scope="session")
def rt_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Fake backend, 4 slots, 40 ms per chunk; sessions with seed 666 lose their state."""
    server = start_fake_server(
        tmp_path_factory.mktemp("rt"), max_sessions=4,
        server_args_overrides={"fake_forward_ms": 40, "fake_lose_session_seed": LOST_SESSION_SEED})
    yield server
    server.stop()
