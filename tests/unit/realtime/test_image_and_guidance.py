"""Image-conditioned starts and classifier-free guidance on the causal DiT (issue 14 item 3):
checkpoints declare them in realtime_config.json; distilled ones refuse them clearly."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pytest
import torch
from PIL import Image

from tests.support.images import random_png
from tests.unit.realtime.helpers import Replies, open_session, run_session, submit
from worldserve.config import RealtimeStageConfig, ServerConfig
from worldserve.engines.realtime.engine import RealtimeEngine
from worldserve.errors import InvalidRequest
from worldserve.models.causal_dit.dev import build_realtime_model
from worldserve.models.causal_dit.runner import CausalRunner


def png(seed: int, width: int = 96, height: int = 64) -> bytes:
    return random_png(width, height, seed)


@pytest.fixture(scope="module")
def ic_model():
    """The dev causal model declared image-conditioned and not guidance-distilled."""
    model = build_realtime_model(0)
    model.config = dataclasses.replace(model.config, image_conditioning=True,
                                       guidance_distilled=False)
    return model


def engine_for(model) -> RealtimeEngine:
    return RealtimeEngine(RealtimeStageConfig(), ServerConfig(), runner=CausalRunner(model))


def test_distilled_text_model_refuses_guidance_and_first_frame(make_engine):
    engine = make_engine()
    caps = engine.capabilities()
    assert not caps.supports_guidance and not caps.supports_first_frame
    with pytest.raises(InvalidRequest, match="distilled without CFG"):
        submit(engine, "s", 0, Replies(), guidance_scale=3.0)
    with pytest.raises(InvalidRequest, match="text-to-video: first_frame is not supported"):
        submit(engine, "s", 0, Replies(), first_frame=png(0))


def test_capabilities_follow_the_checkpoint(ic_model):
    caps = engine_for(ic_model).capabilities()
    assert caps.supports_guidance and caps.supports_first_frame
    assert not caps.requires_first_frame


def test_first_frame_is_the_clean_first_latent_and_later_blocks_attend_to_it(ic_model):
    engine = engine_for(ic_model)
    runs = {}
    for seed in (0, 1):
        runs[seed] = run_session(engine, f"s{seed}", 2, first_frame=png(seed), seed=7)
    session = engine.runner.new_session("probe", _settings(engine, png(0)), "p")
    expected = first_latent_written_out(ic_model.vae, png(0))
    assert torch.equal(session.image_latent, expected)
    out = engine.runner.run_chunk(session, None)
    assert torch.equal(out.latents[:, :, :1], expected)  # pinned clean, never denoised
    # Same seed, same noise: chunk 1 differs only through the cache holding another image.
    assert runs[0][1].frames != runs[1][1].frames


@torch.inference_mode()
def first_latent_written_out(vae, first_frame: bytes) -> torch.Tensor:
    """The 96x64 first_frame as a 64x64 session's clean first latent, without the runner: the
    centre 64 columns (the height already fits, so no resize), pixels to [-1, 1], the VAE's
    posterior mode, normalised by the VAE config's latents mean and std."""
    pixels = np.asarray(Image.open(io.BytesIO(first_frame)).convert("RGB"))[:, 16:80]
    x = torch.from_numpy(pixels.copy()).permute(2, 0, 1).float() / 127.5 - 1.0  # (3, 64, 64)
    z = vae.encode(x[None, :, None]).latent_dist.mode()  # (1, C, 1, 8, 8)
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    return (z - mean) / std


def _settings(engine: RealtimeEngine, first_frame: bytes):
    return engine._settings(open_session("probe", first_frame=first_frame, seed=7))


def test_guidance_with_the_prompt_as_negative_equals_no_guidance(ic_model):
    """v_u + g (v_c - v_u) == v_c when both branches see the same prompt."""
    engine = engine_for(ic_model)
    plain = run_session(engine, "a", 2, prompt="a red car", seed=3)
    same = run_session(engine, "b", 2, prompt="a red car", seed=3, guidance_scale=4.0,
                       negative_prompt="a red car")
    other = run_session(engine, "c", 2, prompt="a red car", seed=3, guidance_scale=4.0,
                        negative_prompt="blurry")
    assert [r.frames for r in plain] == [r.frames for r in same]
    assert plain[0].frames != other[0].frames


def test_guidance_doubles_the_forward(ic_model):
    engine = engine_for(ic_model)
    calls = []
    hook = ic_model.dit.register_forward_hook(lambda *args: calls.append(1))
    try:
        run_session(engine, "a", 1, seed=3)
        plain = len(calls)
        calls.clear()
        run_session(engine, "b", 1, seed=3, guidance_scale=2.0)
    finally:
        hook.remove()
    steps = engine.default_steps
    assert plain == steps + 1 and len(calls) == 2 * steps + 1  # + the context pass
