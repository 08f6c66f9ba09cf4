"""Ulysses-2 (all-to-all over heads): the transformer's arithmetic is that of one process (the
sound track is bit-identical); frames go through the strip-parallel VAE decode (within
FRAME_TOLERANCE, one uint8 level). References: the pipeline's own `__call__` and the
one-process runner; several seeds of one request each equal that seed's solo request."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.support.rank_groups import (
    FRAME_TOLERANCE,
    action_params,
    assert_extras_close,
    assert_frames_close,
    group_fixtures,
    params,
    run_to_end,
)
from tests.support.seeds import SEEDS, assert_each_seed_equals_its_solo_run

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


group, solo_runner = group_fixtures("ulysses=2")


def test_video_with_sound_equals_the_pipeline_call(group, solo_runner):
    p = params(generate_sound=True, negative_prompt="blurry")
    frames, extras = run_to_end(group, p)
    out = solo_runner.pipe(
        prompt=p.prompt, negative_prompt=p.negative_prompt, fps=p.fps,
        num_inference_steps=p.num_inference_steps, guidance_scale=p.guidance_scale,
        generator=torch.Generator("cpu").manual_seed(p.seeds[0]), output_type="np",
        num_frames=p.num_frames, height=p.height, width=p.width, enable_sound=True)
    assert_frames_close(frames, out.video, FRAME_TOLERANCE)
    assert extras is not None and np.array_equal(extras.audio, out.sound.float().numpy())


def test_image_and_forward_dynamics_equal_one_process(group, solo_runner):
    for p in (params(num_frames=1, width=32, height=32), action_params("forward_dynamics")):
        frames, extras = run_to_end(group, p)
        ref_frames, ref_extras = run_to_end(solo_runner, p)
        assert_frames_close(frames, ref_frames, FRAME_TOLERANCE)
        assert_extras_close(extras, ref_extras, 0.0)


def test_interleaved_requests_equal_their_solo_runs(group):
    a, b = params(generate_sound=True, seeds=[1]), params(num_frames=1, width=32, seeds=[2])
    solo_a, solo_b = run_to_end(group, a), run_to_end(group, b)
    state_a = group.prepare(["a"], [a], a.seeds)
    state_b = group.prepare(["b"], [b], b.seeds)
    while not (state_a.done_denoising and state_b.done_denoising):
        for state in (state_a, state_b):
            if not state.done_denoising:
                group.denoise_step(state)
    assert np.array_equal(group.decode(state_a, 0), solo_a[0])
    assert np.array_equal(group.extras(state_a, 0).audio, solo_a[1].audio)
    assert np.array_equal(group.decode(state_b, 0), solo_b[0])


def test_several_seeds_of_one_request_equal_each_seeds_solo_request(group):
    assert_each_seed_equals_its_solo_run(group, params(generate_sound=True, seeds=SEEDS))
