"""The realtime WebSocket against a real server whose realtime model is a world-model directory
that starts from an image (tiny random weights): SANA-WM (with a refiner/) and Cosmos3 with action
heads. first_frame is required, camera keys steer (chunk 0 included), warm-up runs before the
server reports ready."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from tests.integration.realtime.helpers import Session, connect
from tests.support.images import random_png


def _sana_wm(target: Path) -> None:
    from worldserve.models.sana_wm.dev import build_sana_wm

    build_sana_wm(target, 0)


def _cosmos3(target: Path) -> None:
    from worldserve.models.cosmos3.dev import Cosmos3DevConfig, build_cosmos3

    build_cosmos3(target, 0, Cosmos3DevConfig(sound=False))


# family: (builder, held keys of the session, frames of chunk 0 and chunk 1)
FAMILIES: dict[str, tuple[Callable[[Path], None], str, list[int]]] = {
    "sana_wm": (_sana_wm, "w-8,jw-16", [25, 24]),
    "cosmos3": (_cosmos3, "w-4,jw-8", [9, 8]),
}


async def run_session(server, seed: int, keys: str) -> list:
    async with connect(server) as ws:
        session = Session(ws)
        await session.send({"type": "init", "prompt": "a road", "size": "64x64", "seed": seed,
                            "max_chunks": 2, "first_frame": random_png(80, 48),
                            "condition_inputs": {"action": keys}})
        chunks, code, _ = await session.read_until_close(timeout_s=120)
    assert not session.errors, session.errors
    assert code == 1000
    return chunks


@pytest.mark.parametrize("family", sorted(FAMILIES))
async def test_world_directory_serves_image_started_sessions(server_factory, tmp_path, family):
    build, keys, frames = FAMILIES[family]
    model = tmp_path / family
    model.mkdir()
    build(model)
    server = server_factory({"stages": {
        "generation": {"enabled": False}, "reasoner": {"enabled": False},
        "realtime": {"enabled": True, "backend": "causal", "model_path": str(model),
                     "num_inference_steps": 2, "warmup_mode": "server",
                     "warmup_sizes": ["64x64"]}}})
    assert "realtime warm-up done for 64x64" in server.log()  # before /health said ready
    async with connect(server) as ws:
        session = Session(ws)
        await session.send({"type": "init", "prompt": "a road", "size": "64x64"})
        error = await session.recv_map(timeout_s=30)
    assert error["code"] == "invalid_init" and "first_frame is required" in error["detail"]
    steered = await run_session(server, 5, keys)
    assert [len(c.frames) for c in steered] == frames
    assert steered[0].frames.shape[1:] == (64, 64, 3)
    # the keys steer: the same seed and image without them gives other frames, chunk 0 included
    still = await run_session(server, 5, "none-1")
    for k in (0, 1):
        assert not np.array_equal(steered[k].frames, still[k].frames), f"chunk {k}"
