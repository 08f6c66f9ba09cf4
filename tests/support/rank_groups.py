"""Helpers of the rank-group tests (tests/unit/parallel, tests/integration/parallel): the
requests they run, a group started with the test process as rank 0, and the comparisons.

Equality bounds, measured on CPU with gloo and one torch thread per rank (docs/parallel.md):
cfg, ulysses and shard leave the transformer's arithmetic unchanged (sound and actions equal
bit for bit); ring merges partial attention by log-sum-exp and the strip-parallel VAE runs the
same convolutions on smaller tensors, whose vectorised element-wise tails round differently:
frames then differ by at most FRAME_TOLERANCE (floats in [0, 1]), one uint8 level at most.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.support.images import random_png as png
from worldserve.config import GenerationStageConfig
from worldserve.ipc.messages import ActionCondition, GenerationParams
from worldserve.models import registry
from worldserve.models.types import RowExtras

FRAME_TOLERANCE = 1e-5  # max |difference| of float frames in [0, 1]
RING_TOLERANCE = 1e-5  # max |difference| of sound / action values with ring attention,
# relative to the largest |value| when that exceeds 1
PROMPT = "a robot arm picks up the blue cup"


def params(**overrides: Any) -> GenerationParams:
    """A 2-step CFG request, 5 frames of 48x64 (4 latent rows: the VAE decode can split)."""
    base: dict[str, Any] = dict(prompt=PROMPT, width=48, height=64, num_frames=5,
                                num_inference_steps=2, guidance_scale=4.0, seeds=[3], fps=24.0)
    base.update(overrides)
    return GenerationParams(**base)


def action_params(mode: str = "policy", **overrides: Any) -> GenerationParams:
    """A CFG action run on a 40x56 observation (tier 256; 32x48 frames): actions for policy."""
    raw = np.random.default_rng(2).normal(size=(4, 29)).tolist()
    action = ActionCondition(mode=mode, domain_name="agibotworld", chunk_size=4,
                             resolution_tier=256,
                             raw_actions=raw if mode == "forward_dynamics" else None)
    return params(condition_images=[png(56, 40)], action=action, **overrides)


def run_to_end(runner: Any, p: GenerationParams) -> tuple[np.ndarray, RowExtras | None]:
    """prepare, every step, decode and extras of one row: the engine's phases in order."""
    state = runner.prepare(["one"], [p], p.seeds)
    while not state.done_denoising:
        runner.denoise_step(state)
    return runner.decode(state, 0), runner.extras(state, 0)


def as_uint8(frames: np.ndarray) -> np.ndarray:
    return (frames * 255).round().astype(np.uint8)


def assert_frames_close(ours: np.ndarray, ref: np.ndarray, tolerance: float) -> None:
    """Within `tolerance` as floats and at most one uint8 level apart (0: identical)."""
    assert ours.shape == ref.shape
    if tolerance == 0:
        assert np.array_equal(ours, ref)
        return
    assert float(np.abs(ours - ref).max()) <= tolerance
    assert int(np.abs(as_uint8(ours).astype(int) - as_uint8(ref)).max()) <= 1


def assert_extras_close(ours: RowExtras | None, ref: RowExtras | None,
                        tolerance: float) -> None:
    if ref is None:
        assert ours is None
        return
    assert ours is not None
    for name in ("audio", "action"):
        a, b = getattr(ours, name), getattr(ref, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.shape == b.shape
            scale = max(1.0, float(np.abs(b).max()))  # actions reach ~10: a relative bound
            assert float(np.abs(a - b).max()) <= tolerance * scale, name


@contextmanager
def rank_group(model_dir: Path, parallel: str, **stage: Any) -> Iterator[Any]:
    """A rank group with this process as rank 0 (one torch thread per rank), closed after."""
    from worldserve.ranks.runner import start_rank_runner

    torch.set_num_threads(1)
    config = GenerationStageConfig(model_path=model_dir, parallel=parallel, **stage)
    runner = start_rank_runner(config, model_dir)
    try:
        yield runner
    finally:
        runner.group.close()


def solo_fixture() -> Any:
    """A module-scoped fixture over the dev Cosmos3: `solo_runner`, the one-process runner a
    rank group must equal (one torch thread, as each rank has). A test module without a
    group fixture binds it under that name: `solo_runner = solo_fixture()`."""

    @pytest.fixture(scope="module", name="solo_runner")
    def solo_runner(cosmos3_dir: Path) -> Any:
        torch.set_num_threads(1)
        return registry.load_runner("generation", cosmos3_dir)

    return solo_runner


def group_fixtures(layout: str) -> tuple[Any, Any]:
    """Module-scoped fixtures over the dev Cosmos3: `group`, a rank group of `layout` with this
    process as rank 0, and `solo_runner` (solo_fixture). A test module binds them under those
    names: `group, solo_runner = group_fixtures(LAYOUT)`."""

    @pytest.fixture(scope="module", name="group")
    def group(cosmos3_dir: Path) -> Iterator[Any]:
        with rank_group(cosmos3_dir, layout) as runner:
            yield runner

    return group, solo_fixture()


def build_lora(model_dir: Path, target: Path) -> Path:
    """A rank-4 adapter on the attention projections of the tiny Cosmos3 transformer
    (diffusers layout: `transformer.` keys, B scaled up so that it changes the output)."""
    from diffusers.models.transformers.transformer_cosmos3 import Cosmos3OmniTransformer
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    torch.manual_seed(4)
    transformer = Cosmos3OmniTransformer.from_pretrained(model_dir / "transformer")
    transformer.add_adapter(LoraConfig(r=4, lora_alpha=4, init_lora_weights=False,
                                       target_modules=["to_q", "add_q_proj", "to_add_out"]))
    state = get_peft_model_state_dict(transformer)
    target.mkdir(parents=True)
    save_file({f"transformer.{k}": (v * 10 if "lora_B" in k else v).contiguous()
               for k, v in state.items()}, str(target / "pytorch_lora_weights.safetensors"))
    return target


def build_updated(model_dir: Path, target: Path) -> Path:
    """The tiny Cosmos3 transformer with every weight nudged (a `POST /admin/weights/update`
    directory: `transformer/` in the diffusers layout)."""
    from diffusers.models.transformers.transformer_cosmos3 import Cosmos3OmniTransformer

    generator = torch.Generator().manual_seed(5)
    transformer = Cosmos3OmniTransformer.from_pretrained(model_dir / "transformer")
    with torch.no_grad():
        for param in transformer.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    transformer.save_pretrained(target / "transformer")
    return target
