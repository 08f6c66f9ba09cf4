"""`compile: true` on the tiny Cosmos3 generator: off by default, compiled blocks (with the
understanding K/V reuse, as the engine configures them) equal eager within a documented
tolerance, the compile time is measured on the first forward, and the
warmup that pays it blocks requests; several seeds of one compiled request each equal their
solo compiled run.

torch.compile's inductor backend compiles C++ on a CPU (minutes on this shared machine), so the
equivalence runs with `backend="aot_eager"` (the runner's test-only `compile_backend` knob):
it traces and runs the same dynamo / AOT-autograd graphs with dynamic shapes but eager kernels.
Inductor itself is measured by `benchmarks/generation.py --model cosmos3 --compile`."""

from __future__ import annotations

import pytest
import torch

from tests.support.seeds import SEEDS, assert_each_seed_equals_its_solo_run
from worldserve.config import GenerationStageConfig
from worldserve.engines.generation.warmup import WarmupPlan
from worldserve.ipc.messages import GenerationParams
from worldserve.models import registry

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

# aot_eager runs the traced graph with eager kernels: measured bit-equal on the dev model; the
# tolerance covers decompositions that reorder float32 arithmetic.
COMPILE_ATOL = 1e-5


def denoised(runner, p: GenerationParams) -> torch.Tensor:
    state = runner.prepare(["r"], [p], p.seeds)
    while not state.done_denoising:
        runner.denoise_step(state)
    return state.rows[0].latents


def compiled_layers(runner) -> list[bool]:
    return [layer._compiled_call_impl is not None for layer in runner.pipe.transformer.layers]


def test_compile_is_off_by_default(cosmos3_dir):
    assert GenerationStageConfig().compile is False
    runner = registry.load_runner("generation", cosmos3_dir)
    runner.configure_speed(understanding_kv_reuse=True)  # what the engine does by default
    assert not any(compiled_layers(runner))
    assert runner.describe()["speed"]["compile"] is False


def test_compiled_blocks_equal_eager_and_the_warmup_pays_the_compilation(cosmos3_dir):
    torch.set_num_threads(1)
    eager = registry.load_runner("generation", cosmos3_dir)
    runner = registry.load_runner("generation", cosmos3_dir)
    runner.configure_speed(compile=True, understanding_kv_reuse=True,
                           compile_backend="aot_eager")
    assert all(compiled_layers(runner))
    assert runner.kv_reuse is not None  # reuse runs eagerly between the compiled parts
    speed = runner.describe()["speed"]
    assert speed["compile"] is True and speed["compile_s"] is None  # compiles on first forward
    # two sizes: dynamic shapes serve the second without a failure
    for p in (GenerationParams(prompt="a robot arm", width=48, height=32, num_frames=5,
                               num_inference_steps=2, guidance_scale=4.0, seeds=[3], fps=24.0),
              GenerationParams(prompt="a red cup on a table", width=64, height=48,
                               num_frames=5, num_inference_steps=2, guidance_scale=4.0,
                               seeds=[4], fps=24.0)):
        torch.testing.assert_close(denoised(runner, p), denoised(eager, p), rtol=0,
                                   atol=COMPILE_ATOL)
    assert runner.describe()["speed"]["compile_s"] > 0
    state = runner.prepare(["r"], [p], p.seeds)
    runner.denoise_step(state)
    assert state.rows[0].understanding_kv["cond"].recorded  # later steps replay it
    plan = WarmupPlan.create(GenerationStageConfig(compile=True), runner.features.defaults,
                             runner)
    assert plan.blocking  # requests queue behind the warmup that compiles
    assert not WarmupPlan.create(GenerationStageConfig(), runner.features.defaults,
                                 runner).blocking


def test_several_seeds_of_one_compiled_request_equal_each_seeds_solo_run(cosmos3_dir):
    torch.set_num_threads(1)
    runner = registry.load_runner("generation", cosmos3_dir)
    runner.configure_speed(compile=True, understanding_kv_reuse=True,
                           compile_backend="aot_eager")
    p = GenerationParams(prompt="a robot arm", width=48, height=32, num_frames=5,
                         num_inference_steps=2, guidance_scale=4.0, seeds=SEEDS, fps=24.0)
    assert_each_seed_equals_its_solo_run(runner, p)
