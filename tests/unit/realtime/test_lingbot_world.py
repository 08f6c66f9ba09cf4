"""LingBot-World-style causal checkpoints (upstream key layout, camera branch, 36-channel image
condition) on the causal runner.

The upstream reference lines are transcribed inline from Robbyant/lingbot-world (HEAD 6ca87d4):
`wan/utils/cam_utils.py` (compute_relative_poses :54-73, get_plucker_embeddings :77-112),
`wan/image2video.py` (:355-362, the per-latent-cell rearrange) and `wan/modules/model.py`
(:256-263 block camera term, :502-521 patch rearrange + embedding).
"""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from tests.unit.realtime.helpers import Replies, run_session, submit
from worldserve.config import RealtimeStageConfig, ServerConfig
from worldserve.engines.realtime.engine import RealtimeEngine
from worldserve.errors import InvalidRequest
from worldserve.models import registry
from worldserve.models.camera_keys import rollout_c2w
from worldserve.models.causal_dit.dev import build_lingbot_realtime
from worldserve.models.causal_dit.lingbot import (
    chunk_camera_tokens,
    chunk_poses,
    plucker_rays,
    ray_tokens,
    relative_poses,
)
from worldserve.models.causal_dit.model import block_causal_mask
from worldserve.models.causal_dit.runner import dmd_sigmas
from worldserve.models.causal_dit.wan_causal import CausalWanDiT

ATOL = 1e-4
LATENT = 16


# ---------------------------------------------------------------------------- upstream formulas


def upstream_se3_inverse(T):  # cam_utils.py SE3_inverse
    rot, trans = T[:, :3, :3], T[:, :3, 3:]
    r_inv = rot.transpose(-1, -2)
    out = torch.eye(4, dtype=T.dtype)[None].repeat(T.shape[0], 1, 1)
    out[:, :3, :3] = r_inv
    out[:, :3, 3:] = -torch.bmm(r_inv, trans)
    return out


def upstream_relative_poses(c2ws):  # compute_relative_poses(framewise=True, normalize=True)
    rel = torch.matmul(upstream_se3_inverse(c2ws[0:1]), c2ws)
    rel[0] = torch.eye(4, dtype=c2ws.dtype)
    rel[1:] = torch.bmm(upstream_se3_inverse(rel[:-1]), rel[1:])
    translations = rel[:, :3, 3]
    max_norm = torch.norm(translations, dim=-1).max()
    if max_norm > 0:
        rel[:, :3, 3] = translations / max_norm
    return rel


def upstream_plucker(c2ws, ks, height, width):  # get_plucker_embeddings
    n = c2ws.shape[0]
    ys, xs = torch.meshgrid(torch.arange(height, dtype=c2ws.dtype),
                            torch.arange(width, dtype=c2ws.dtype), indexing="ij")
    grid = (torch.stack([xs, ys], -1).view(-1, 2) + 0.5)[None].repeat(n, 1, 1)
    fx, fy, cx, cy = ks.chunk(4, dim=-1)
    i, j = grid[..., 0], grid[..., 1]
    zs = torch.ones_like(i)
    directions = torch.stack([(i - cx) / fx * zs, (j - cy) / fy * zs, zs], dim=-1)
    directions = directions / directions.norm(dim=-1, keepdim=True)
    rays_d = directions @ c2ws[:, :3, :3].transpose(-1, -2)
    rays_o = c2ws[:, :3, 3][:, None, :].expand_as(rays_d)
    return torch.cat([rays_o, rays_d], dim=-1).view(n, height, width, 6)


def upstream_tokens(rays, stride, patch):
    """image2video.py 'f (h c1) (w c2) c -> (f h w) (c c1 c2)' (c1 = c2 = stride), then
    model.py '1 c (f c1) (h c2) (w c3) -> 1 (f h w) (c c1 c2 c3)' (c1 = 1, c2 = c3 = patch),
    written as index loops."""
    f, h, w, _ = rays.shape
    lh, lw = h // stride, w // stride
    cells = torch.zeros(f, lh, lw, 6 * stride * stride, dtype=rays.dtype)
    for hh in range(lh):
        for ww in range(lw):
            for c in range(6):
                for c1 in range(stride):
                    for c2 in range(stride):
                        cells[:, hh, ww, c * stride * stride + c1 * stride + c2] = \
                            rays[:, hh * stride + c1, ww * stride + c2, c]
    channels = cells.shape[-1]
    out = torch.zeros(1, f, (lh // patch) * (lw // patch), channels * patch * patch,
                      dtype=rays.dtype)
    for ph in range(lh // patch):
        for pw in range(lw // patch):
            for c in range(channels):
                for c2 in range(patch):
                    for c3 in range(patch):
                        out[0, :, ph * (lw // patch) + pw, c * patch * patch + c2 * patch + c3] = \
                            cells[:, ph * patch + c2, pw * patch + c3, c]
    return out


def test_rays_and_tokens_equal_the_upstream_formulas():
    c2w = torch.from_numpy(rollout_c2w([["w", "l"], ["i"], ["d", "k"], ["s", "j"]], 4)[0])
    c2w = c2w.double()
    ks = torch.tensor([[30.0, 28.0, 15.5, 17.0]], dtype=torch.float64)
    want = upstream_tokens(upstream_plucker(upstream_relative_poses(c2w.clone()),
                                            ks.repeat(5, 1), 32, 32), 8, 2)
    got = ray_tokens(plucker_rays(relative_poses(c2w.clone()), (30.0, 28.0, 15.5, 17.0), 32,
                                  32), 8, 2)
    assert got.shape == (1, 5, 4, 6 * 64 * 4)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_chunked_rollout_continues_the_pitch_of_earlier_chunks():
    """Pure rotation (no translation to normalise): chunk-by-chunk poses == the poses of one
    rollout over the whole script, sampled at every 4th output frame."""
    script = [["i"], ["i", "l"], ["j"], ["k"], [], ["i"], ["l"], ["i"]] * 4
    first, later = script[:8], [script[8:20], script[20:32]]
    poses, pitch = chunk_poses(first, True, 3, 4, 0)
    parts = [poses]
    for part in later:
        poses, pitch = chunk_poses(part, False, 3, 4, pitch)
        parts.append(poses)
    full = torch.from_numpy(rollout_c2w(script, 32)[0][::4]).double()
    torch.testing.assert_close(torch.cat(parts), relative_poses(full), rtol=0, atol=1e-5)
    assert pitch == rollout_c2w(script, 32)[1] > 0


# ---------------------------------------------------------------------------- sessions


def png(seed: int, width: int = 40, height: int = 32) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def lingbot_dir(tmp_path_factory):
    """The dev realtime directory with a LingBot-World-style upstream-layout pickle as its
    transformer (dim 24, 2 layers, 36 -> 16 channels, camera weights)."""
    target = tmp_path_factory.mktemp("lingbot") / "lb"
    target.mkdir()
    build_lingbot_realtime(target, 0)
    return target


@pytest.fixture(scope="module")
def lingbot_runner(lingbot_dir):
    return registry.load_runner("realtime", lingbot_dir)


def engine_for(runner) -> RealtimeEngine:
    return RealtimeEngine(RealtimeStageConfig(), ServerConfig(), runner=runner)


SCRIPTS = [[["w"]] * 4 + [["i", "d"]] * 4, [["w", "l"]] * 6 + [["s"]] * 6,
           [["k"]] * 12, [["a", "j"]] * 3]


@torch.inference_mode()
def reference_session(model, settings, image, scripts, prompt):
    """No cache: every step is one masked forward over all clean frames so far (with their
    conditions and camera tokens) plus the noisy block; the runner's seeded noise draws."""
    dit, g = model.dit, torch.Generator().manual_seed(settings.seed)
    f = model.spatial_factor // dit.cfg.patch_size
    h, w, fb = settings.height // f, settings.width // f, settings.frames_per_block
    tpf = dit.tokens_per_frame(h, w)
    text_kv = model.encode_prompt(prompt)
    cond = model.encode_condition(image, settings.width, settings.height, 2 * fb)
    intrinsics = (502.9116 * settings.width / 832, 503.10812 * settings.height / 480,
                  415.77786 * settings.width / 832, 239.77779 * settings.height / 480)
    clean = torch.zeros(1, dit.cfg.in_channels + dit.cfg.cond_channels, 0, h, w)
    cams, pitch = torch.zeros(1, 0, tpf, dit.camera_branch.in_features), 0
    for k, script in enumerate(scripts):
        tokens, pitch = chunk_camera_tokens(script, k == 0, fb, 4, pitch, intrinsics,
                                            settings.height, settings.width, 8, 2)
        cams = torch.cat([cams, tokens], 1)
        block_cond = cond[:, :, :fb] if k == 0 else cond[:, :, fb:]
        x = torch.randn(1, LATENT, fb, h, w, generator=g)
        n = clean.shape[2] + fb
        mask = block_causal_mask(n, fb, tpf, settings.sink_frames, settings.window_frames)
        sigmas = dmd_sigmas(settings.num_inference_steps, 5.0)
        for i, sigma in enumerate(sigmas):
            t = torch.cat([torch.zeros(1, n - fb), torch.full((1, fb), sigma * 1000)], 1)
            inp = torch.cat([clean, torch.cat([x, block_cond], 1)], 2)
            v, _ = dit(inp, t, cams, torch.arange(n), text_kv, mask=mask)
            x0 = x - sigma * v[:, :, -fb:]
            if i + 1 < len(sigmas):
                x = (1 - sigmas[i + 1]) * x0 + sigmas[i + 1] * torch.randn(
                    1, LATENT, fb, h, w, generator=g)
        clean = torch.cat([clean, torch.cat([x0, block_cond], 1)], 2)
    return clean[:, :LATENT]


def run_chunks(engine, session_id, scripts, **init):
    replies = run_session(engine, session_id, 1, camera=scripts[0], **init)
    session = engine.sessions.get(session_id)
    generated = [session.cache.latents[:, :LATENT].clone()]
    for k, script in enumerate(scripts[1:], start=1):
        submit(engine, session_id, k, Replies(), camera=script)
        while engine.has_work():
            engine.step()
        generated.append(session.cache.latents[:, :LATENT, -3:].clone())
    return replies, session, torch.cat(generated, 2)


@pytest.mark.parametrize("sink,window", [(0, 100), (3, 9)])
def test_lingbot_checkpoint_serves_sessions_equal_to_the_reference(lingbot_runner, sink,
                                                                   window):
    assert isinstance(lingbot_runner.model.dit, CausalWanDiT)
    engine = engine_for(lingbot_runner)
    caps = engine.capabilities()
    assert caps.camera_conditioning and caps.requires_first_frame
    image = png(1)
    replies, session, got = run_chunks(engine, "s", SCRIPTS, seed=7, width=32, height=32,
                                       sink_size=sink, window_frames=window,
                                       first_frame=image)
    assert replies[0].num_frames == 9
    assert session.cache.latents.shape[1] == 36  # retained with its condition
    with Image.open(io.BytesIO(image)) as img:
        ref = reference_session(lingbot_runner.model, session.settings, img.convert("RGB"),
                                SCRIPTS, "a red car")
    assert got.shape == ref.shape
    assert (got - ref).abs().max().item() < ATOL


def test_camera_keys_change_only_later_chunks(lingbot_runner):
    engine = engine_for(lingbot_runner)
    init = dict(seed=3, width=32, height=32, first_frame=png(2))
    other = SCRIPTS[:2] + [[["d", "l"]] * 12, SCRIPTS[3]]
    _, _, a = run_chunks(engine, "a", SCRIPTS, **init)
    _, _, b = run_chunks(engine, "b", other, **init)
    assert torch.equal(a[:, :, :6], b[:, :, :6])
    assert (a[:, :, 6:9] - b[:, :, 6:9]).abs().max().item() > 1e-3


def test_first_frame_is_required_and_bad_keys_are_refused(lingbot_runner):
    engine = engine_for(lingbot_runner)
    with pytest.raises(InvalidRequest, match="first_frame is required"):
        submit(engine, "s", 0, Replies())
    replies = run_session(engine, "t", 1, width=32, height=32, first_frame=png(3),
                          camera=[["x"]])
    assert "unknown camera key 'x'" in str(replies[-1])


def test_rebuilt_cache_equals_the_cached_one(lingbot_runner):
    """A refresh recomputes the K/V from the retained latents, conditions and camera tokens."""
    engine = engine_for(lingbot_runner)
    _, session, _ = run_chunks(engine, "s", SCRIPTS[:3], seed=1, width=32, height=32,
                               sink_size=3, window_frames=6, first_frame=png(4))
    cached = [(k.clone(), v.clone()) for k, v in session.cache.kv]
    with torch.inference_mode():
        lingbot_runner.rebuild(session)
    for (k, v), (k2, v2) in zip(cached, session.cache.kv):
        assert (k - k2).abs().max().item() < 1e-5 and (v - v2).abs().max().item() < 1e-5


def test_init_intrinsics_follow_the_image_resize_and_crop():
    from worldserve.models.causal_dit.runner import session_intrinsics
    from worldserve.models.types import WorldSessionSettings

    settings = WorldSessionSettings(seed=0, width=32, height=32, num_inference_steps=1,
                                    sink_frames=0, window_frames=9, frames_per_block=3,
                                    intrinsics=(50.0, 40.0, 20.0, 16.0))
    image = Image.new("RGB", (80, 64))  # resized to 40 x 32, then 4 px cropped left and right
    fx, fy, cx, cy = session_intrinsics(settings, image)
    assert (fx, fy, cx, cy) == pytest.approx((25.0, 20.0, 10.0 - 4.0, 8.0))
    default = session_intrinsics(dataclasses.replace(settings, intrinsics=None), image)
    assert default == pytest.approx((502.9116 * 32 / 832, 503.10812 * 32 / 480,
                                     415.77786 * 32 / 832, 239.77779 * 32 / 480))


def upstream_block(st, i, x, e, context, cam, heads):
    """model.py WanAttentionBlock.forward (:226-275) on the upstream weights, RoPE left out
    (identity), with the camera term of :256-263."""
    b = f"blocks.{i}."

    def lin(name, v):
        return F.linear(v, st[b + name + ".weight"], st[b + name + ".bias"])

    def rms(name, v):  # WanRMSNorm
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6) * st[b + name + ".weight"]

    def ln(v):  # WanLayerNorm without affine
        return F.layer_norm(v, v.shape[-1:], eps=1e-6)

    def attn(prefix, xq, xkv):
        q = rms(prefix + ".norm_q", lin(prefix + ".q", xq)).unflatten(2, (heads, -1))
        k = rms(prefix + ".norm_k", lin(prefix + ".k", xkv)).unflatten(2, (heads, -1))
        v = lin(prefix + ".v", xkv).unflatten(2, (heads, -1))
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2))
        return lin(prefix + ".o", out.transpose(1, 2).flatten(2))

    e = (st[b + "modulation"].unsqueeze(0) + e).chunk(6, dim=2)
    e = [m.squeeze(2) for m in e]
    y = attn("self_attn", ln(x) * (1 + e[1]) + e[0], ln(x) * (1 + e[1]) + e[0])
    x = x + y * e[2]
    hidden = lin("cam_injector_layer2", F.silu(lin("cam_injector_layer1", cam))) + cam
    x = (1.0 + lin("cam_scale_layer", hidden)) * x + lin("cam_shift_layer", hidden)
    norm3 = F.layer_norm(x, x.shape[-1:], st[b + "norm3.weight"], st[b + "norm3.bias"], 1e-6)
    x = x + attn("cross_attn", norm3, context)
    y = lin("ffn.2", F.gelu(lin("ffn.0", ln(x) * (1 + e[4]) + e[3]), approximate="tanh"))
    return x + y * e[5]


@torch.no_grad()
def test_a_block_equals_upstreams_block_with_its_camera_term(tmp_path):
    """Weights mapped from the upstream layout + the camera branch, one block with RoPE set
    to identity, against the upstream block written from model.py on the raw weights."""
    from worldserve.models.causal_dit.dev import lingbot_world_state
    from worldserve.models.causal_dit.upstream import load_upstream

    st = lingbot_world_state(9, dim=24, layers=2, text=8)
    torch.save(st, tmp_path / "lb.pt")
    dit = CausalWanDiT(*load_upstream(tmp_path / "lb.pt"))
    g = torch.Generator().manual_seed(0)
    n, tokens = 8, torch.randn(1, 8, dit.camera_branch.in_features, generator=g)
    x, e = torch.randn(1, n, 24, generator=g), torch.randn(1, n, 6, 24, generator=g)
    text = torch.randn(1, 5, 8, generator=g)
    p = F.linear(tokens, st["patch_embedding_wancamctrl.weight"],
                 st["patch_embedding_wancamctrl.bias"])
    hidden = F.silu(F.linear(p, st["c2ws_hidden_states_layer1.weight"],
                             st["c2ws_hidden_states_layer1.bias"]))
    cam = p + F.linear(hidden, st["c2ws_hidden_states_layer2.weight"],
                       st["c2ws_hidden_states_layer2.bias"])
    torch.testing.assert_close(dit.camera_branch.embed(tokens), cam)
    context = F.linear(F.gelu(F.linear(text, st["text_embedding.0.weight"],
                                       st["text_embedding.0.bias"]), approximate="tanh"),
                       st["text_embedding.2.weight"], st["text_embedding.2.bias"])
    rope = (torch.ones(1, n, 1, 24), torch.zeros(1, n, 1, 24))
    for i in range(2):
        got, _ = dit._block(dit.wan.blocks[i], x, e, rope, dit.text_kv(text)[i], None, None,
                            (dit.camera_branch.blocks[i], cam))
        want = upstream_block(st, i, x, e, context, cam, heads=1)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
