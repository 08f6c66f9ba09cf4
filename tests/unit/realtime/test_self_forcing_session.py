"""A realtime directory whose transformer/ is a Self-Forcing-style pickle (upstream Wan keys):
loaded through the registry, served by the causal runner, equal to the uncached reference."""

from __future__ import annotations

import json
import shutil

import torch

from tests.unit.realtime.helpers import Replies, run_session, submit, upstream_wan_state
from tests.unit.realtime.test_causal_equivalence import ATOL, _reference_session
from worldserve.config import RealtimeStageConfig, ServerConfig
from worldserve.engines.realtime.engine import RealtimeEngine
from worldserve.models import registry
from worldserve.models.causal_dit.dev import build_realtime
from worldserve.models.causal_dit.wan_causal import CausalWanDiT


def self_forcing_dir(tmp_path):
    """The dev realtime directory with its transformer replaced by an upstream-layout pickle
    (dim 24, 2 layers, 16 latent channels, UMT5 width 32) and Wan's zero-padded text."""
    target = tmp_path / "sf"
    target.mkdir()
    build_realtime(target, 0)
    shutil.rmtree(target / "transformer")
    (target / "transformer").mkdir()
    state = upstream_wan_state(5, dim=24, channels=16, text=32)
    torch.save({"generator_ema": {f"model.{k}": v for k, v in state.items()}},
               target / "transformer" / "self_forcing_dmd.pt")
    config = json.loads((target / "realtime_config.json").read_text())
    (target / "realtime_config.json").write_text(json.dumps({**config, "pad_text_tokens": 40}))
    return target


def test_self_forcing_checkpoint_serves_sessions_equal_to_the_reference(tmp_path):
    runner = registry.load_runner("realtime", self_forcing_dir(tmp_path))
    assert isinstance(runner.model.dit, CausalWanDiT)
    engine = RealtimeEngine(RealtimeStageConfig(), ServerConfig(), runner=runner)
    assert not engine.capabilities().camera_conditioning
    replies = run_session(engine, "s", 1, seed=7, width=32, height=32, sink_size=0,
                          window_frames=100)
    session = engine.sessions.get("s")
    generated = [session.cache.latents.clone()]
    for k in range(1, 4):
        submit(engine, "s", k, Replies())
        engine.step()
        generated.append(session.cache.latents[:, :, -3:].clone())
    assert replies[0].num_frames == 9
    assert session.text_kv[0][0].shape[2] == 40  # Wan-style zero-padded context
    ref = _reference_session(runner.model, session.settings, 4, "a red car")
    got = torch.cat(generated, 2)
    assert got.shape == ref.shape
    assert (got - ref).abs().max().item() < ATOL
