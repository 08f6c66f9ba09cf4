"""The realtime WebSocket against a real server whose realtime model is a Cosmos3 directory with
action heads (tiny random weights): first_frame required, camera keys, warm-up."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from tests.integration.realtime.helpers import Session, connect
from worldserve.models.cosmos3.dev import Cosmos3DevConfig, build_cosmos3


def png(width: int = 80, height: int = 48) -> bytes:
    pixels = (np.random.RandomState(0).rand(height, width, 3) * 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


async def test_cosmos3_directory_serves_world_sessions(server_factory, tmp_path):
    model = tmp_path / "cosmos3"
    model.mkdir()
    build_cosmos3(model, 0, Cosmos3DevConfig(sound=False))
    server = server_factory({"stages": {
        "generation": {"enabled": False}, "reasoner": {"enabled": False},
        "realtime": {"enabled": True, "backend": "causal", "model_path": str(model),
                     "num_inference_steps": 2, "warmup_mode": "server",
                     "warmup_sizes": ["64x64"]}}})
    async with connect(server) as ws:
        session = Session(ws)
        await session.send({"type": "init", "prompt": "a road", "size": "64x64"})
        error = await session.recv_map(timeout_s=30)
    assert error["code"] == "invalid_init" and "first_frame is required" in error["detail"]
    async with connect(server) as ws:
        session = Session(ws)
        await session.send({"type": "init", "prompt": "a road", "size": "64x64", "seed": 5,
                            "max_chunks": 2, "first_frame": png(),
                            "condition_inputs": {"action": "w-4,jw-8"}})
        chunks, code, _ = await session.read_until_close(timeout_s=120)
    assert not session.errors, session.errors
    assert code == 1000 and [len(c.frames) for c in chunks] == [9, 8]
    assert chunks[0].frames.shape[1:] == (64, 64, 3)
