"""StreamingService against the fake engine through the in-process stage client: the paths
that need a frame to hang (delete aborting it, the frame timeout)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import AsyncIterator

import pytest

from tests.integration.streaming.support import SESSION_BODY, image_bytes
from worldserve.api.runtime import ServerRuntime
from worldserve.api.schemas.streaming import CreateSessionBody
from worldserve.api.streaming.service import StreamingService
from worldserve.api.streaming.sessions import StreamSessionState
from worldserve.config import ServerConfig
from worldserve.engines.reasoner.fake import FakeReasonerEngine
from worldserve.errors import Conflict, RequestTimeout
from worldserve.runtime.inprocess import InProcessStageClient


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[tuple[StreamingService, FakeReasonerEngine]]:
    config = ServerConfig.model_validate({"stages": {"generation": {"enabled": False}, "reasoner": {
        "backend": "fake", "fake_hang_on_frame": 1, "streaming": {"frame_timeout_s": 0.5}}}})
    engine = FakeReasonerEngine(config.stages.reasoner, config)
    client = InProcessStageClient("reasoner", engine)
    yield StreamingService(ServerRuntime(config=config, clients={"reasoner": client})), engine
    await client.close()


async def test_delete_aborts_a_frame_that_outlives_the_wait(service) -> None:
    svc, engine = service
    session = await svc.create(CreateSessionBody(**SESSION_BODY), "rest")
    await svc.frame(session, image_bytes())
    hung = asyncio.ensure_future(svc.frame(session, image_bytes(seed=1)))
    await asyncio.sleep(0.05)
    assert session.state == StreamSessionState.BUSY
    assert await svc.close(session, wait_s=0.1) == 1
    with pytest.raises(Conflict, match="^session was closed$"):
        await hung
    assert session.state == StreamSessionState.CLOSED
    assert engine.stats() == {"queue_depth": 0, "running": 0, "sessions": 0}
    assert len(svc.registry) == 0


async def test_frame_timeout_fails_closed(service) -> None:
    svc, engine = service
    session = await svc.create(CreateSessionBody(**SESSION_BODY), "ws")
    await svc.frame(session, image_bytes())
    with pytest.raises(RequestTimeout, match="timed out after 0.5 s; the session was closed"):
        await svc.frame(session, image_bytes(seed=1))
    assert session.state == StreamSessionState.DEAD
    assert engine.stats()["sessions"] == 0  # released in the stage at once
    with pytest.raises(Conflict, match="no longer usable"):
        await svc.frame(session, image_bytes())
    assert await svc.close(session) == 1
