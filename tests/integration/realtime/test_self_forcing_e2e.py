"""A real server whose realtime model directory holds a Self-Forcing-style pickle (upstream Wan
keys) under transformer/: sessions stream, camera scripts are refused (no camera branch)."""

from __future__ import annotations

import json
import shutil

import torch

from tests.integration.realtime.helpers import Session, connect
from tests.unit.realtime.helpers import upstream_wan_state
from worldserve.models.causal_dit.dev import build_realtime


async def test_self_forcing_directory_serves_text_sessions(server_factory, tmp_path):
    model = tmp_path / "self-forcing"
    model.mkdir()
    build_realtime(model, 0)
    shutil.rmtree(model / "transformer")
    (model / "transformer").mkdir()
    state = upstream_wan_state(5, dim=24, channels=16, text=32)
    torch.save({"generator_ema": {f"model.{k}": v for k, v in state.items()}},
               model / "transformer" / "self_forcing_dmd.pt")
    config = json.loads((model / "realtime_config.json").read_text())
    (model / "realtime_config.json").write_text(json.dumps({**config, "pad_text_tokens": 40}))
    server = server_factory({"stages": {
        "generation": {"enabled": False}, "reasoner": {"enabled": False},
        "realtime": {"enabled": True, "backend": "causal", "model_path": str(model)}}})
    async with connect(server) as ws:
        session = Session(ws)
        await session.send({"type": "init", "prompt": "a road", "size": "64x64",
                            "condition_inputs": {"action": "w-8"}})
        error = await session.recv_map(timeout_s=30)
    assert error["code"] == "invalid_init" and "camera" in error["detail"], error
    async with connect(server) as ws:
        session = Session(ws)
        await session.send({"type": "init", "prompt": "a road", "size": "64x64", "seed": 2,
                            "max_chunks": 2})
        chunks, code, _ = await session.read_until_close(timeout_s=60)
    assert not session.errors, session.errors
    assert code == 1000 and [len(c.frames) for c in chunks] == [9, 12]
