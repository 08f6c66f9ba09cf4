"""Cosmos3 speed levers on the tiny generator: the understanding K/V reuse equals recomputation
bit for bit (and really skips the understanding stream), attention backends (default native
untouched, `_native_math` within tolerance, unavailable ones fail startup naming what is
missing), the stage fields and /admin/model_info."""

from __future__ import annotations

import msgspec
import pydantic
import pytest
import torch

from tests.support.seeds import SEEDS, assert_pairwise_different
from tests.unit.models.test_cosmos3 import params as cosmos3_params
from tests.unit.models.test_cosmos3 import png
from worldserve.config import GenerationStageConfig, ServerConfig
from worldserve.engines.generation.engine import GenerationEngine
from worldserve.ipc.messages import ActionCondition, GenerationParams, ModelInfoRequest
from worldserve.levers.speed import check_attention_backend
from worldserve.levers.step_cache import METHODS, StepCacheSettings
from worldserve.models import registry
from worldserve.models.types import ModelLoadError

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

# `_native_math` vs the default SDPA dispatch (float32, 3 steps of the dev model): measured
# max |diff| 0 to ~1e-7 on the latents; 1e-5 leaves room for other CPUs' kernels.
BACKEND_ATOL = 1e-5


@pytest.fixture(scope="module")
def plain(cosmos3_dir):
    torch.set_num_threads(1)
    return registry.load_runner("generation", cosmos3_dir)


@pytest.fixture(scope="module")
def reusing(cosmos3_dir):
    runner = registry.load_runner("generation", cosmos3_dir)
    runner.configure_speed(understanding_kv_reuse=True)
    return runner


def params(**overrides) -> GenerationParams:
    return cosmos3_params(**{"num_inference_steps": 3, **overrides})


def denoised(runner, p: GenerationParams):
    state = runner.prepare(["r"], [p], p.seeds)
    while not state.done_denoising:
        runner.denoise_step(state)
    return state.rows[0]


def assert_same_rows(a, b) -> None:
    for name in ("latents", "sound_latents", "action_latents"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert torch.equal(x, y), name


def test_reuse_equals_recomputation_and_skips_the_understanding_stream(plain, reusing):
    p = params(generate_sound=True, negative_prompt="blurry")
    calls: list[int] = []
    to_q = reusing.pipe.transformer.layers[0].self_attn.to_q
    hook = to_q.register_forward_hook(lambda *_: calls.append(1))
    state = reusing.prepare(["r"], [p], p.seeds)
    try:
        per_step = []
        while not state.done_denoising:
            before = len(calls)
            reusing.denoise_step(state)
            per_step.append(len(calls) - before)
            if not state.done_denoising:
                kv = state.rows[0].understanding_kv
                assert set(kv) == {"cond", "uncond"} and kv["cond"].recorded
                assert len(kv["cond"].keys) == len(reusing.pipe.transformer.layers)
    finally:
        hook.remove()
    # step 0 runs the understanding projections for cond and uncond; later steps replay them
    assert per_step == [2, 0, 0]
    assert state.rows[0].understanding_kv == {}  # freed after the last step
    assert_same_rows(state.rows[0], denoised(plain, p))
    assert reusing.describe()["speed"]["understanding_kv_reuse"] is True


def test_reuse_equals_recomputation_for_image_and_action_runs_interleaved(plain, reusing):
    image = png(56, 40)
    i2v = params(condition_images=[image], seeds=[5])
    action = ActionCondition(mode="policy", chunk_size=4, domain_name="agibotworld",
                             resolution_tier=256)
    policy = params(action=action, condition_images=[image], guidance_scale=1.0)
    states = [reusing.prepare([str(i)], [p], p.seeds) for i, p in enumerate((i2v, policy))]
    while not all(s.done_denoising for s in states):
        for s in states:
            if not s.done_denoising:
                reusing.denoise_step(s)
    assert_same_rows(states[0].rows[0], denoised(plain, i2v))
    assert_same_rows(states[1].rows[0], denoised(plain, policy))


def test_stage_defaults_leave_the_transformer_as_loaded(plain):
    cfg = GenerationStageConfig()
    assert (cfg.attention_backend, cfg.compile, cfg.understanding_kv_reuse) == ("native", False,
                                                                              True)
    from diffusers.models.transformers.transformer_cosmos3 import Cosmos3AttnProcessor

    for layer in plain.pipe.transformer.layers:
        assert type(layer.self_attn.processor) is Cosmos3AttnProcessor
        assert layer.self_attn.processor._attention_backend is None
    assert plain.describe()["speed"] == {"attention_backend": "native", "compile": False,
                                         "compile_s": None, "understanding_kv_reuse": False}


def test_native_math_backend_is_set_on_every_processor_and_equal_within_tolerance(
        cosmos3_dir, plain):
    runner = registry.load_runner("generation", cosmos3_dir)
    runner.configure_speed(attention_backend="_native_math", understanding_kv_reuse=True)
    for layer in runner.pipe.transformer.layers:
        assert layer.self_attn.processor._attention_backend.value == "_native_math"
    p = params(num_frames=1, width=32, height=32)
    ours, theirs = denoised(runner, p), denoised(plain, p)
    torch.testing.assert_close(ours.latents, theirs.latents, rtol=0, atol=BACKEND_ATOL)
    assert runner.describe()["speed"]["attention_backend"] == "_native_math"
    # diffusers' process-wide default is left as it was: a model loaded next dispatches as before
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    assert _AttentionBackendRegistry.get_active_backend()[0].value == "native"


@pytest.mark.parametrize("backend, message", [
    ("flash", "flash-attn"), ("_flash_3", "Flash Attention 3"), ("sage", "sageattention"),
    ("_native_cudnn", "cannot run on device 'cpu'"),
    ("_native_efficient", "cannot run on device 'cpu'")])
def test_backends_this_machine_cannot_run_are_refused_naming_why(backend, message):
    with pytest.raises(ModelLoadError, match=message):
        check_attention_backend(backend, "cpu", torch.float32, gqa=True)


def test_unavailable_backend_fails_stage_startup(cosmos3_dir, tmp_path):
    cfg = GenerationStageConfig(model_path=cosmos3_dir, output_dir=tmp_path / "out",
                                attention_backend="flash")
    with pytest.raises(ModelLoadError, match="attention_backend 'flash' cannot run here.*"
                                             "flash-attn"):
        GenerationEngine(cfg, ServerConfig())


@pytest.mark.parametrize("backend", ["sage", "_sage_qk_int8_pv_fp8_cuda_sm90",
                                     "_sage_qk_int8_pv_fp16_triton", "sage_varlen"])
def test_quantised_backends_are_refused_for_cosmos3_before_loading(cosmos3_dir, tmp_path,
                                                                   monkeypatch, backend):
    """int8/fp8 attention breaks Cosmos3's mixture-of-transformers attention: the family
    allows exact backends only, and a stage refuses the rest before reading a weight."""
    from worldserve.config import ATTENTION_BACKENDS
    from worldserve.models.cosmos3.family import FAMILY
    from worldserve.models.wan.family import FAMILY as WAN

    assert FAMILY.attention_backends < set(ATTENTION_BACKENDS) and "native" in \
        FAMILY.attention_backends and not any("sage" in b for b in FAMILY.attention_backends)
    assert WAN.attention_backends is None  # other families: whatever runs here
    monkeypatch.setattr(registry, "load_runner", lambda *a, **k: pytest.fail("loaded"))
    cfg = GenerationStageConfig(model_path=cosmos3_dir, output_dir=tmp_path / "out",
                                attention_backend=backend)
    with pytest.raises(ModelLoadError, match=f"attention_backend {backend!r} is not allowed "
                                             "for the cosmos3 family.*_native_cudnn"):
        GenerationEngine(cfg, ServerConfig())


def test_unknown_backend_is_a_config_error_listing_the_choices():
    with pytest.raises(pydantic.ValidationError, match="'fastest' is not a diffusers attention "
                                                       "backend.*_native_math.*sage"):
        GenerationStageConfig(attention_backend="fastest")
    with pytest.raises(pydantic.ValidationError, match="one-process generation only"):
        GenerationStageConfig(attention_backend="_native_math", parallel="cfg=2")
    lifted = GenerationStageConfig(server_args_overrides={"attention_backend": "_native_math",
                                                          "enable_torch_compile": True})
    assert lifted.attention_backend == "_native_math" and lifted.compile is True


def test_model_info_reports_the_levers(cosmos3_dir, tmp_path):
    cfg = GenerationStageConfig(model_path=cosmos3_dir, output_dir=tmp_path / "out",
                                attention_backend="_native_math")
    engine = GenerationEngine(cfg, ServerConfig())
    replies: list = []
    engine.submit(ModelInfoRequest(request_id="i"), replies.append)
    assert replies[-1].data["speed"] == {"attention_backend": "_native_math", "compile": False,
                                         "compile_s": None, "understanding_kv_reuse": True}


def test_reuse_runs_beside_the_step_cache_for_rows_that_do_not_cache(cosmos3_dir):
    # The engine's order: reuse processors, then the step-cache hooks (installed at startup
    # for every Cosmos3 stage; a row caches only when its request asks).
    settings = StepCacheSettings(method="taylorseer")
    plain = registry.load_runner("generation", cosmos3_dir)
    cached_plain = registry.load_runner("generation", cosmos3_dir)
    cached_plain.enable_step_cache(settings)
    both = registry.load_runner("generation", cosmos3_dir)
    both.configure_speed(understanding_kv_reuse=True)
    both.enable_step_cache(settings)
    p = params(num_frames=1, width=32, height=32)
    state = both.prepare(["r"], [p], p.seeds)
    both.denoise_step(state)
    assert set(state.rows[0].understanding_kv) == {"cond", "uncond"}  # recorded: it reuses
    while not state.done_denoising:
        both.denoise_step(state)
    assert_same_rows(state.rows[0], denoised(plain, p))
    caching = msgspec.structs.replace(p, step_cache=True)
    state = both.prepare(["c"], [caching], caching.seeds)
    both.denoise_step(state)
    assert state.rows[0].understanding_kv == {}  # nothing recorded: the cache hooks run alone
    while not state.done_denoising:
        both.denoise_step(state)
    assert_same_rows(state.rows[0], denoised(cached_plain, caching))


def test_reuse_for_several_seeds_of_one_request_equals_each_seeds_solo_run(plain, reusing):
    p = params(seeds=SEEDS, negative_prompt="blurry")
    state = reusing.prepare(["r"] * len(SEEDS), [p] * len(SEEDS), SEEDS)
    while not state.done_denoising:
        reusing.denoise_step(state)
    solos = [denoised(plain, msgspec.structs.replace(p, seeds=[seed])) for seed in SEEDS]
    for row, solo in zip(state.rows, solos, strict=True):
        assert_same_rows(row, solo)
    assert_pairwise_different([solo.latents for solo in solos])


@pytest.mark.parametrize("method", METHODS)
def test_step_cache_for_several_seeds_of_one_request_equals_each_seeds_solo_run(
        cosmos3_dir, method):
    """Each row keeps its own cache context: three cached rows stepped together equal three
    cached solo runs (a shared context would reuse one row's residual for another)."""
    runner = registry.load_runner("generation", cosmos3_dir)
    runner.enable_step_cache(StepCacheSettings(method=method, threshold=0.5 if method ==
                                               "seacache" else None))
    p = params(seeds=SEEDS, step_cache=True, num_inference_steps=6)
    state = runner.prepare(["r"] * len(SEEDS), [p] * len(SEEDS), SEEDS)
    while not state.done_denoising:
        runner.denoise_step(state)
    rows = [(row.latents.clone(), runner.step_cache_stats(state, i))
            for i, row in enumerate(state.rows)]
    assert any(stats.num_forwards_skipped for _, stats in rows)  # the cache did skip work
    assert_pairwise_different([latents for latents, _ in rows])
    for seed, (latents, stats) in zip(SEEDS, rows, strict=True):
        solo = msgspec.structs.replace(p, seeds=[seed])
        solo_state = runner.prepare(["s"], [solo], [seed])
        while not solo_state.done_denoising:
            runner.denoise_step(solo_state)
        assert torch.equal(latents, solo_state.rows[0].latents), seed
        assert runner.step_cache_stats(solo_state, 0) == stats
