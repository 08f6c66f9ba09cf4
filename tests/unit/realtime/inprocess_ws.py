"""The realtime WebSocket route in-process, around an InProcessStageClient of a real engine:
shared by the family tests (SANA-WM, Cosmos3 world) that stream a session through the api."""

from __future__ import annotations

import asyncio
from typing import Iterator

import msgpack
import numpy as np
import pytest

from worldserve.api.app import create_app
from worldserve.api.runtime import ServerRuntime
from worldserve.config import RealtimeStageConfig, ServerConfig
from worldserve.engines.realtime.engine import RealtimeEngine
from worldserve.runtime.inprocess import InProcessStageClient


@pytest.fixture
def clients() -> Iterator[list[InProcessStageClient]]:
    """The stage clients a test made, closed after it."""
    made: list[InProcessStageClient] = []
    yield made
    for client in made:
        asyncio.run(client.close())


def app_for(runner, clients: list[InProcessStageClient], stage: dict):
    """The api app whose realtime stage is a RealtimeEngine around `runner`."""
    config = ServerConfig.model_validate({"stages": {"realtime": {"enabled": True, **stage}}})
    engine = RealtimeEngine(RealtimeStageConfig(**stage), ServerConfig(), runner=runner)
    client = InProcessStageClient("realtime", engine)
    clients.append(client)
    return create_app(ServerRuntime(config=config, clients={"realtime": client}))


def read_chunk(ws, size: int) -> np.ndarray:
    """One whole chunk (its frame batches up to its chunk_stats), raw RGB24 of size x size."""
    parts = []
    while True:
        header = msgpack.unpackb(ws.receive_bytes())
        if header["type"] == "chunk_stats":
            return np.concatenate(parts)
        assert header["type"] in ("frame_batch", "frame_batch_header"), header
        payload = header.get("payload") or ws.receive_bytes()
        parts.append(np.frombuffer(payload, np.uint8).reshape(-1, size, size, 3))
