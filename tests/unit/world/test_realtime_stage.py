"""The realtime model's training (tools/world_training/train_realtime.py) packs what a session
feeds the DiT: frame 0's latent as the runner pins it, camera vectors as the runner builds them
from the same keys, and the runner's few-step sigmas with the image frame clean."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tools.world_training.train_realtime import (
    Pool,
    RealtimeTrainConfig,
    chunk_camera,
    clip_latents,
    later_chunk,
    noisy_batch,
    row_keys,
    session_settings,
)
from worldserve.models.causal_dit.dev import build_realtime_model
from worldserve.models.causal_dit.model import CAMERA_KEYS
from worldserve.models.causal_dit.runner import CausalRunner, dmd_sigmas
from worldserve.models.dev.world.render import png_bytes
from worldserve.models.dev.world.scenes import make_clip


@pytest.fixture(scope="module")
def model():
    model = build_realtime_model(0)
    model.config = dataclasses.replace(model.config, image_conditioning=True)
    return model


def test_frame_zero_and_keys_are_what_a_session_from_the_clips_first_frame_feeds(model) -> None:
    runner = CausalRunner(model)
    for seed in (3, 4):
        clip = make_clip(seed, "agent")
        session = runner.new_session("s", session_settings(model, 0, png_bytes(clip.frames[0])),
                                     "p")
        assert torch.equal(clip_latents(model, clip.frames)[None, :, :1], session.image_latent)
        served = runner._camera_input(session, clip.keys_per_step, first=True)
        assert torch.equal(chunk_camera(model, clip.keys_per_step)[None], served)


def test_held_d_lands_in_every_latent_frame_of_the_first_chunk(model) -> None:
    """Entry j of the keys produced frame j + 1: 8 entries for a 9-frame chunk; padded to the
    chunk's 12 (a client holding the key), the last latent frame holds it fully."""
    d = CAMERA_KEYS.index("d")
    eight = chunk_camera(model, [["d"]] * 8)
    assert eight[:, d].tolist() == [1.0, 1.0, 0.75]
    full = chunk_camera(model, row_keys([["d"]] * 8, True, 12))
    assert full[:, d].tolist() == [1.0, 1.0, 1.0]
    assert float(full.sum()) == 3.0  # no other key


def test_a_batch_noises_later_frames_at_the_runners_sigmas_with_frame_zero_clean(model) -> None:
    clips = [make_clip(seed, "agent") for seed in range(4)]
    pool = Pool(torch.stack([clip_latents(model, c.frames) for c in clips]),
                [c.keys_per_step for c in clips], ["p"] * 4)
    cfg = RealtimeTrainConfig(batch_size=64, free_first_frame=0.0)
    batch = noisy_batch(model, pool, np.random.default_rng(0), cfg)
    sigmas = dmd_sigmas(model.config.default_num_inference_steps, model.config.timestep_shift)
    served = {torch.full((1,), s * 1000.0).item() for s in sigmas}  # the runner's float32 t
    assert set(batch["t"][:, 1:].flatten().tolist()) == served
    assert bool((batch["t"][:, 0] == 0).all()) and bool((batch["weight"][:, :, 0] == 0).all())
    assert torch.equal(batch["x"][:, :, 0], pool.latents[batch["index"]][:, :, 0])


def test_later_chunks_are_drawn_by_their_weights() -> None:
    """Equal weights draw as the uniform choice of the runs before weights (so their recorded
    commands still reproduce); (1, 3) trains the third chunk three times as often."""
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    assert [later_chunk(a, (1, 1)) for _ in range(50)] == [
        1 + int(b.integers(2)) for _ in range(50)]
    rng = np.random.default_rng(0)
    drawn = [later_chunk(rng, (1, 3)) for _ in range(4000)]
    assert set(drawn) == {1, 2} and 0.72 < drawn.count(2) / len(drawn) < 0.78


def test_a_later_chunks_teacher_forced_cache_is_what_the_runner_commits(model) -> None:
    """The later-chunk rows' cache (one block-causal pass at t = 0 over the clip's clean chunks)
    equals the K/V the runner appends chunk by chunk (`_commit`), and each chunk's camera
    vectors are the runner's for that chunk's slice of the session script."""
    from tools.world_training.realtime_chunks import (
        build_session_pool,
        chunk_entries,
        session_keys,
    )
    from worldserve.models.causal_dit.model import block_causal_mask

    pool = build_session_pool(model, range(7, 8), key_seed=0)
    script = session_keys(np.random.default_rng([23, 0, 7]), chunk_entries(model))
    runner = CausalRunner(model)
    session = runner.new_session("s", session_settings(model, 0, png_bytes(
        make_clip(7, "agent").frames[0])), pool.prompts[0])
    fb, start = model.config.frames_per_block, 0
    with torch.inference_mode():  # as run_chunk commits
        for chunk, count in enumerate(chunk_entries(model)[:2]):
            cam = runner._camera_input(session, script[start:start + count], chunk == 0)
            assert torch.equal(cam[0], pool.cameras[0, fb * chunk:fb * (chunk + 1)])
            span = slice(fb * chunk, fb * (chunk + 1))
            runner._commit(session, pool.latents[:1, :, span], cam,
                           torch.arange(span.start, span.stop))
            start += count
    mask = block_causal_mask(2 * fb, fb, model.dit.tokens_per_frame(8, 8))
    with torch.no_grad():
        text_kv = model.dit.text_kv(model.prompt_states(pool.prompts[0]).clone())
        _, kv = model.dit(pool.latents[:1, :, :2 * fb], torch.zeros(1, 2 * fb),
                          pool.cameras[:1, :2 * fb], torch.arange(2 * fb), text_kv, mask=mask)
    for (k, v), (rk, rv) in zip(kv, session.cache.kv):
        torch.testing.assert_close(k, rk, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(v, rv, rtol=1e-4, atol=1e-5)
