"""The attention backend and compiled blocks on the tiny Wan runner: the backend reaches every
attention processor and matches native within tolerance; the default leaves them untouched;
compiled blocks give each seed of a batched request what its solo compiled run gives;
/admin/model_info reports the levers."""

from __future__ import annotations

import pytest
import torch

from tests.support.seeds import SEEDS, assert_each_seed_equals_its_solo_run
from worldserve.config import GenerationStageConfig, ServerConfig
from worldserve.engines.generation.engine import GenerationEngine
from worldserve.ipc.messages import GenerationParams, ModelInfoRequest
from worldserve.models import registry

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

ATOL = 1e-5  # `_native_math` vs the default SDPA dispatch, float32 (measured <= 1e-7)
# A row of a batched forward vs the same row alone, frames in [0, 1]: measured 6e-8, eager and
# compiled alike (the batch's matmuls round differently); no uint8 level apart.
BATCH_TOLERANCE = 1e-5


def latents(runner, p: GenerationParams) -> torch.Tensor:
    state = runner.prepare(["r"], [p], p.seeds)
    while not state.done_denoising:
        runner.denoise_step(state)
    return state.latents


def backends(runner) -> set:
    return {getattr(m.processor, "_attention_backend", None)
            for m in runner.pipe.transformer.modules() if hasattr(m, "processor")}


def test_native_math_on_wan_is_set_everywhere_and_equal_within_tolerance(tiny_wan_dir):
    torch.set_num_threads(1)
    plain = registry.load_runner("generation", tiny_wan_dir)
    plain.configure_speed()  # the default: nothing changes
    assert backends(plain) == {None}
    runner = registry.load_runner("generation", tiny_wan_dir)
    runner.configure_speed(attention_backend="_native_math")
    assert {b.value for b in backends(runner)} == {"_native_math"}
    p = GenerationParams(prompt="a red car turns left", width=32, height=32, num_frames=1,
                         num_inference_steps=2, guidance_scale=4.0, seeds=[3])
    torch.testing.assert_close(latents(runner, p), latents(plain, p), rtol=0, atol=ATOL)


def test_compiled_blocks_give_each_seed_of_a_batch_its_solo_run(tiny_wan_dir):
    """Wan batches a request's seeds into one forward (B = 3, 6 with guidance): the compiled
    blocks (`aot_eager`, as tests/unit/models/test_cosmos3_compile.py explains) must keep the
    rows apart."""
    torch.set_num_threads(1)
    runner = registry.load_runner("generation", tiny_wan_dir)
    runner.configure_speed(compile=True, compile_backend="aot_eager")
    p = GenerationParams(prompt="a red car turns left", width=32, height=32, num_frames=1,
                         num_inference_steps=2, guidance_scale=4.0, seeds=SEEDS)
    assert_each_seed_equals_its_solo_run(runner, p, BATCH_TOLERANCE)
    assert runner.describe()["speed"]["compile_s"] > 0


def test_wan_model_info_reports_the_levers(tiny_wan_dir, tmp_path):
    cfg = GenerationStageConfig(model_path=tiny_wan_dir, output_dir=tmp_path / "out",
                                attention_backend="_native_math")
    engine = GenerationEngine(cfg, ServerConfig())
    replies: list = []
    engine.submit(ModelInfoRequest(request_id="i"), replies.append)
    assert replies[-1].data["speed"] == {"attention_backend": "_native_math", "compile": False,
                                         "compile_s": None}
