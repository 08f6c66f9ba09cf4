"""Step caching on the dev Cosmos3 (levers/step_cache.py): rows that do not cache equal the
pipeline's own `__call__` bit for bit with the hooks installed, cached rows interleaved with
other requests equal their solo cached runs (and would not under shared context names), the
skipped forwards are counted, and the hooks' per-context state is freed with the row."""

from __future__ import annotations

import gc

import msgspec
import numpy as np
import pytest
import torch

from tests.unit.models.test_cosmos3 import params as cosmos3_params
from worldserve.errors import InvalidRequest
from worldserve.ipc.messages import GenerationParams
from worldserve.levers.step_cache import METHODS, StepCacheSettings
from worldserve.models import registry

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture(scope="module")
def plain(cosmos3_dir):
    torch.set_num_threads(1)
    return registry.load_runner("generation", cosmos3_dir)


@pytest.fixture(scope="module")
def cached_runners(cosmos3_dir):
    runners = {}
    for method in METHODS:
        runner = registry.load_runner("generation", cosmos3_dir)
        runner.enable_step_cache(StepCacheSettings(method=method))
        runners[method] = runner
    return runners


def params(**overrides) -> GenerationParams:
    return cosmos3_params(**{"num_inference_steps": 8, **overrides})


def run(runner, p: GenerationParams):
    state = runner.prepare(["r"], [p], p.seeds)
    while not state.done_denoising:
        runner.denoise_step(state)
    return runner.decode(state, 0), runner.step_cache_stats(state, 0)


def interleave(runner, requests: list[GenerationParams], same_names: bool = False):
    states = [runner.prepare([f"r{i}"], [p], p.seeds) for i, p in enumerate(requests)]
    if same_names:  # what the pipeline's fixed "cond" / "uncond" names amount to
        for state in states:
            state.rows[0].cache.key = "shared"
    while not all(s.done_denoising for s in states):
        for state in states:
            if not state.done_denoising:
                runner.denoise_step(state)
    return [(runner.decode(s, 0), runner.step_cache_stats(s, 0)) for s in states]


@pytest.mark.parametrize("method", METHODS)
def test_rows_that_do_not_cache_equal_the_pipeline(plain, cached_runners, method):
    runner = cached_runners[method]
    for p in (params(), params(num_frames=1, width=32, height=32, num_inference_steps=3)):
        reference = plain.pipe(
            prompt=p.prompt, negative_prompt=p.negative_prompt, fps=p.fps,
            num_inference_steps=p.num_inference_steps, guidance_scale=p.guidance_scale,
            num_frames=p.num_frames, height=p.height, width=p.width, output_type="np",
            generator=torch.Generator("cpu").manual_seed(p.seeds[0])).video
        frames, stats = run(runner, p)
        assert stats is None
        assert np.array_equal(frames, reference)
    assert runner.step_cache.num_contexts() == 0


@pytest.mark.parametrize("method", METHODS)
def test_interleaved_cached_rows_equal_their_solo_cached_runs(plain, cached_runners, method):
    runner = cached_runners[method]
    a = params(step_cache=True)
    b = params(step_cache=True, prompt="waves break on a rocky shore", seeds=[11])
    c = params(seeds=[5])  # not cached, in between
    solo = [run(runner, p) for p in (a, b, c)]
    uncached = [run(plain, msgspec.structs.replace(p, step_cache=False))[0] for p in (a, b)]
    for (frames, stats), uncached in zip(solo[:2], uncached):
        assert stats.num_forwards == 16 and stats.num_forwards_skipped > 0
        assert not np.array_equal(frames, uncached)  # the cache really changed the result
    mixed = interleave(runner, [a, c, b])
    for (frames, stats), (solo_frames, solo_stats) in zip(mixed, [solo[0], solo[2], solo[1]]):
        assert np.array_equal(frames, solo_frames)
        assert stats == solo_stats
    assert runner.step_cache.num_contexts() == 0


@pytest.mark.parametrize("method", METHODS)
def test_shared_context_names_would_leak_between_requests(cached_runners, method):
    runner = cached_runners[method]
    a = params(step_cache=True)
    b = params(step_cache=True, seeds=[11])  # same shapes (other prompts fail outright)
    solo_a = run(runner, a)[0]
    leaked_a = interleave(runner, [a, b], same_names=True)[0][0]
    assert not np.array_equal(leaked_a, solo_a)
    gc.collect()
    assert runner.step_cache.num_contexts() == 0


def test_state_is_freed_when_a_row_finishes_is_cancelled_or_dropped(cached_runners):
    runner = cached_runners["taylorseer"]
    cache = runner.step_cache
    state = runner.prepare(["a"], [params(step_cache=True)], [3])
    runner.denoise_step(state)
    assert cache.num_contexts() > 0
    state.keep_rows([])  # cancelled: the engine drops its rows
    assert cache.num_contexts() == 0
    state = runner.prepare(["b"], [params(step_cache=True)], [3])
    runner.denoise_step(state)
    assert cache.num_contexts() > 0
    del state  # a failed batch is dropped without finishing
    gc.collect()
    assert cache.num_contexts() == 0
    for _ in range(3):  # no growth over jobs
        run(runner, params(step_cache=True, num_inference_steps=3))
        assert cache.num_contexts() == 0


def test_a_runner_without_hooks_refuses_a_cached_request(plain, cached_runners):
    p = params(step_cache=True)
    with pytest.raises(InvalidRequest) as err:
        plain.check(p)
    assert err.value.param == "enable_teacache"
    cached_runners["seacache"].check(p)  # the declaration names the method once enabled
    assert plain.features.step_cache_methods == METHODS
