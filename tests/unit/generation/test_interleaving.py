"""Several running batches at once, advanced round-robin (CPU only: a numpy runner that
satisfies the generation runner contract stands in for a diffusion model)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from worldserve.config import GenerationStageConfig, ServerConfig
from worldserve.engines.generation.engine import GenerationEngine
from worldserve.ipc.capabilities import GenerationDefaults
from worldserve.ipc.messages import GenerateMedia, GenerationParams, GenerationResult
from worldserve.models.types import RunnerFeatures


@dataclass
class FakeBatch:
    row_owner: list[str]
    num_steps: int
    step_index: int = 0

    @property
    def done_denoising(self) -> bool:
        return self.step_index >= self.num_steps

    def keep_rows(self, keep: list[int]) -> None:
        self.row_owner = [self.row_owner[i] for i in keep]


@dataclass
class FakeRunner:
    """Records which rows every denoising step ran, in order."""

    max_batch_size: int | None = None
    pipe: object = None
    size_multiple: int = 16
    temporal_stride: int = 4
    num_params: int = 0
    features: RunnerFeatures = RunnerFeatures(
        family="fake", defaults=GenerationDefaults(width=16, height=16, num_frames=1,
                                                   num_inference_steps=2))
    steps: list[tuple[str, ...]] = field(default_factory=list)

    def snap_frames(self, num_frames: int) -> int:
        return num_frames

    def check(self, params: GenerationParams) -> None:
        pass

    def prepare(self, row_owner: list[str], rows: list[GenerationParams],
                seeds: list[int]) -> FakeBatch:
        return FakeBatch(list(row_owner), rows[0].num_inference_steps)

    def denoise_step(self, state: FakeBatch) -> None:
        self.steps.append(tuple(state.row_owner))
        state.step_index += 1

    def decode(self, state: FakeBatch, row: int) -> np.ndarray:
        return np.zeros((1, 16, 16, 3), np.float32)

    def extras(self, state: FakeBatch, row: int) -> None:
        return None


def make_engine(tmp_path: Path, runner: FakeRunner, **config) -> GenerationEngine:
    model = tmp_path / "model"
    model.mkdir()
    (model / "worldserve_dev.json").write_text(json.dumps({"served_model_name": "fake"}))
    cfg = GenerationStageConfig(model_path=model, output_dir=tmp_path / "out", batch_wait_ms=0,
                                **config)
    engine = GenerationEngine(cfg, ServerConfig(), runner=runner)
    while engine.has_work():  # the background warmup request
        engine.step()
    runner.steps.clear()
    return engine


def media(rid: str, steps: int = 3, width: int = 16) -> GenerateMedia:
    params = GenerationParams(prompt=rid, width=width, height=16, num_frames=1,
                              num_inference_steps=steps, guidance_scale=1.0, seeds=[0])
    return GenerateMedia(request_id=rid, params=params, output_stem=rid, output_format="png")


def run(engine: GenerationEngine, rids: list[str], **kw) -> dict[str, list]:
    replies: dict[str, list] = {rid: [] for rid in rids}
    for rid in rids:
        engine.submit(media(rid, **kw), replies[rid].append)
    while engine.has_work():
        engine.step()
    return replies


def test_one_row_runner_interleaves_requests_round_robin(tmp_path):
    runner = FakeRunner(max_batch_size=1)
    engine = make_engine(tmp_path, runner)
    replies = run(engine, ["a", "b", "c"])
    order = runner.steps[:3]
    assert sorted(order) == [("a",), ("b",), ("c",)]
    assert runner.steps == order * 3  # one step each, in turn
    assert all(isinstance(r[-1], GenerationResult) for r in replies.values())


def test_batching_runner_keeps_compatible_requests_in_one_batch(tmp_path):
    runner = FakeRunner(max_batch_size=None)
    engine = make_engine(tmp_path, runner, max_batch_size=4)
    before = engine.stats()["extra"]
    run(engine, ["a", "b", "c"])
    assert runner.steps == [("a", "b", "c")] * 3
    after = engine.stats()["extra"]  # the batching telemetry: 3 steps of 3 rows
    assert after["denoise_steps"] - before["denoise_steps"] == 3
    assert after["denoise_rows"] - before["denoise_rows"] == 9


def test_incompatible_requests_run_as_interleaved_batches(tmp_path):
    runner = FakeRunner()
    engine = make_engine(tmp_path, runner)
    engine.submit(media("a"), lambda r: None)
    engine.submit(media("b"), lambda r: None)
    engine.submit(media("wide", width=32), lambda r: None)
    engine.step()  # starts the a+b batch
    engine.step()  # room left: starts the second batch too
    assert [len(batch.requests) for batch in engine.scheduler.running] == [2, 1]
    while engine.has_work():
        engine.step()
    assert sorted(runner.steps[:2]) == [("a", "b"), ("wide",)]
    assert runner.steps == runner.steps[:2] * 3


@pytest.mark.parametrize("cap", [1, 2])
def test_max_running_requests_caps_concurrency(tmp_path, cap):
    runner = FakeRunner(max_batch_size=1)
    engine = make_engine(tmp_path, runner, max_running_requests=cap)
    for rid in ("a", "b", "c"):
        engine.submit(media(rid, steps=2), lambda r: None)
    most = 0
    while engine.has_work():
        engine.step()
        most = max(most, engine.stats()["running"])
    assert most == cap
    first_steps = runner.steps[:2 * cap]
    assert sorted(set(first_steps)) == [(rid,) for rid in "ab"[:cap]]
