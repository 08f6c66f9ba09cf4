"""Cached chunk-by-chunk computation == one full block-causal forward (float32, |diff| < 1e-4).

The tolerance covers float32 reordering between one attention over N keys and the same keys
split as cache + block; measured max |diff| is about 1e-6.
"""

from __future__ import annotations

import pytest
import torch

from tests.unit.realtime.helpers import Replies, run_session, submit
from worldserve.models.causal_dit.camera import camera_vectors, output_frames_per_latent
from worldserve.models.causal_dit.kv_cache import FrameRecord, SelfAttnCache
from worldserve.models.causal_dit.model import block_causal_mask
from worldserve.models.causal_dit.runner import dmd_sigmas
from worldserve.models.types import WorldSessionSettings as SessionSettings

ATOL = 1e-4
F_BLOCK, C, H, W = 3, 16, 4, 4  # 4x4 latents: 4 tokens per frame
TPF = (H // 2) * (W // 2)


def _inputs(num_blocks: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    n = num_blocks * F_BLOCK
    latents = torch.randn(1, C, n, H, W, generator=g)
    camera = (torch.rand(1, n, 8, generator=g) > 0.5).float()
    return latents, camera


def _full_forward(dit, latents, camera, timesteps, text_kv, sink=None, window=None):
    n = latents.shape[2]
    mask = block_causal_mask(n, F_BLOCK, TPF, sink, window)
    out, _ = dit(latents, timesteps, camera, torch.arange(n), text_kv, mask=mask)
    return out


def _chunked_forward(dit, latents, camera, timesteps, text_kv, sink, window):
    cache = SelfAttnCache(TPF, sink, window)
    outs, max_tokens = [], 0
    for b in range(latents.shape[2] // F_BLOCK):
        sl = slice(b * F_BLOCK, (b + 1) * F_BLOCK)
        cache.make_room(F_BLOCK)
        pos = torch.arange(sl.start, sl.stop)
        out, kv = dit(latents[:, :, sl], timesteps[:, sl], camera[:, sl], pos, text_kv,
                      past_kv=cache.past())
        cache.append(kv, latents[:, :, sl], camera[:, sl],
                     [FrameRecord(i, i, b) for i in range(sl.start, sl.stop)])
        max_tokens = max(max_tokens, cache.num_tokens)
        outs.append(out)
    return torch.cat(outs, dim=2), max_tokens


@pytest.mark.parametrize("sink,window", [(0, 1000), (3, 9), (0, 6), (2, 8)])
@torch.inference_mode()
def test_cached_chunks_equal_block_causal_forward(rt_model, sink, window):
    dit = rt_model.dit
    latents, camera = _inputs(num_blocks=6)
    text_kv = rt_model.encode_prompt("a red car")
    t = torch.zeros(1, latents.shape[2])  # context pass: clean frames at t = 0
    unbounded = window >= latents.shape[2]
    full = _full_forward(dit, latents, camera, t, text_kv,
                         None if unbounded else sink, None if unbounded else window)
    chunked, max_tokens = _chunked_forward(dit, latents, camera, t, text_kv, sink, window)
    assert (full - chunked).abs().max().item() < ATOL
    assert max_tokens <= min(window, latents.shape[2]) * TPF


@torch.inference_mode()
def test_window_changes_the_result(rt_model):
    """Guard against a mask or cache that ignores the window (the test above would pass)."""
    dit = rt_model.dit
    latents, camera = _inputs(num_blocks=5)
    text_kv = rt_model.encode_prompt("a red car")
    t = torch.zeros(1, latents.shape[2])
    unbounded = _full_forward(dit, latents, camera, t, text_kv)
    windowed, _ = _chunked_forward(dit, latents, camera, t, text_kv, 3, 6)
    assert (unbounded - windowed).abs().max().item() > 1e-3


@torch.inference_mode()
def _reference_session(model, settings: SessionSettings, num_chunks: int, prompt: str):
    """Generate without any cache: every denoising step runs one full masked forward over all
    clean frames so far plus the noisy block; the same seeded noise draws as the runner."""
    dit, g = model.dit, torch.Generator().manual_seed(settings.seed)
    f = model.spatial_factor // dit.cfg.patch_size  # VAE spatial factor
    h, w = settings.height // f, settings.width // f
    tpf = dit.tokens_per_frame(h, w)
    text_kv = model.encode_prompt(prompt)
    clean = torch.zeros(1, C, 0, h, w)
    cams = torch.zeros(1, 0, 8)
    fb = settings.frames_per_block
    for k in range(num_chunks):
        counts = output_frames_per_latent(k == 0, fb, 4)
        cams = torch.cat([cams, camera_vectors(None, counts, 12)[None]], 1)
        x = torch.randn(1, C, fb, h, w, generator=g)
        n = clean.shape[2] + fb
        mask = block_causal_mask(n, fb, tpf, settings.sink_frames, settings.window_frames)
        for i, sigma in enumerate(dmd_sigmas(settings.num_inference_steps, 5.0)):
            t = torch.cat([torch.zeros(1, n - fb), torch.full((1, fb), sigma * 1000)], 1)
            v, _ = dit(torch.cat([clean, x], 2), t, cams, torch.arange(n), text_kv, mask=mask)
            x0 = x - sigma * v[:, :, -fb:]
            if i + 1 < settings.num_inference_steps:
                s2 = dmd_sigmas(settings.num_inference_steps, 5.0)[i + 1]
                x = (1 - s2) * x0 + s2 * torch.randn(1, C, fb, h, w, generator=g)
        clean = torch.cat([clean, x0], 2)
    return clean


@pytest.mark.parametrize("sink,window", [(0, 100), (3, 9)])
def test_session_generation_equals_uncached_reference(make_engine, rt_model, sink, window):
    engine = make_engine()
    num_chunks = 5
    run_session(engine, "s", 1, seed=7, sink_size=sink, window_frames=window, width=32,
                height=32)
    session = engine.sessions.get("s")
    generated = [session.cache.latents.clone()]
    for k in range(1, num_chunks):
        submit(engine, "s", k, Replies())
        engine.step()
        generated.append(session.cache.latents[:, :, -3:].clone())
    ref = _reference_session(rt_model, session.settings, num_chunks, "a red car")
    got = torch.cat([generated[0][:, :, :3]] + generated[1:], 2)
    assert got.shape == ref.shape
    assert (got - ref).abs().max().item() < ATOL
