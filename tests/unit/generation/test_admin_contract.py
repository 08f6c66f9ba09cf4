"""Admin operations against the runner contract, CPU only (the numpy runner of
test_interleaving): pause holds every step, a LoRA runner sees each batch's own selection
before each of its steps, and runners without the optional capabilities refuse cleanly."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tests.unit.generation.test_interleaving import FakeBatch, FakeRunner, make_engine, media
from worldserve.engines.generation.contract import LoraRunner
from worldserve.errors import InvalidRequest, NotSupported
from worldserve.ipc.messages import (
    AdminResult,
    GenerationContinue,
    GenerationPause,
    GenerationResult,
    LoraLoad,
    LoraRef,
    MemoryRelease,
    WeightsUpdate,
)


@dataclass
class LoraFakeRunner(FakeRunner):
    """Records (active selection, rows) for every denoising step."""

    active: tuple = ()
    adapters: dict[str, float] = field(default_factory=dict)
    seen: list[tuple[tuple, tuple[str, ...]]] = field(default_factory=list)

    def load_lora(self, name: str, path: str, scale: float, path_2=None) -> dict:
        self.adapters[name] = scale
        return {"name": name}

    def unload_lora(self, name: str) -> None:
        del self.adapters[name]

    def list_lora(self) -> list[dict]:
        return [{"name": n, "scale": s} for n, s in self.adapters.items()]

    def resolve_lora(self, refs):
        for name, _ in refs:
            if name not in self.adapters:
                raise InvalidRequest(f"unknown LoRA adapter '{name}'")
        return tuple((n, self.adapters[n] if s is None else s) for n, s in refs)

    def activate_lora(self, selection) -> None:
        self.active = selection

    def denoise_step(self, state: FakeBatch) -> None:
        self.seen.append((self.active, tuple(state.row_owner)))
        super().denoise_step(state)


def with_lora(rid: str, *names: str, steps: int = 3):
    msg = media(rid, steps=steps)
    msg.params.lora = [LoraRef(name=n) for n in names]
    return msg


def test_each_step_runs_with_its_own_batch_selection(tmp_path):
    runner = LoraFakeRunner(max_batch_size=None)
    assert isinstance(runner, LoraRunner)
    engine = make_engine(tmp_path, runner, max_batch_size=4)
    runner.seen.clear()  # the warmup request
    for name, scale in (("a", 0.5), ("b", 1.0)):
        engine.submit(LoraLoad(request_id=name, name=name, path="/p", scale=scale),
                      lambda _: None)
    for msg in (with_lora("x", "a"), with_lora("y", "b"), media("z"), with_lora("w", "a")):
        engine.submit(msg, lambda _: None)
    while engine.has_work():
        engine.step()
    expected = {("x", "w"): (("a", 0.5),), ("y",): (("b", 1.0),), ("z",): ()}
    assert {rows for _, rows in runner.seen} == set(expected)  # x and w share a batch
    for active, rows in runner.seen:
        assert active == expected[rows], (active, rows)
    firsts = [rows for _, rows in runner.seen[:3]]
    assert sorted(firsts) == sorted(expected)  # the three batches were interleaved


def test_pause_holds_every_step_and_continue_resumes(tmp_path):
    runner = FakeRunner(max_batch_size=1)
    engine = make_engine(tmp_path, runner)
    replies: list = []
    engine.submit(media("a", steps=4), replies.append)
    engine.step()
    engine.step()
    done = len(runner.steps)
    engine.submit(GenerationPause(request_id="p"), replies.append)
    engine.submit(media("b", steps=2), replies.append)
    for _ in range(10):
        assert not engine.has_work()
        engine.step()
    assert len(runner.steps) == done
    engine.submit(GenerationContinue(request_id="c"), replies.append)
    while engine.has_work():
        engine.step()
    assert sum(isinstance(r, GenerationResult) for r in replies) == 2
    assert sum(isinstance(r, AdminResult) for r in replies) == 2
    assert runner.steps.count(("a",)) == 4 and runner.steps.count(("b",)) == 2


def test_runner_without_capabilities(tmp_path):
    engine = make_engine(tmp_path, FakeRunner())
    with pytest.raises(InvalidRequest, match="does not support LoRA"):
        engine.submit(with_lora("x", "a"), lambda _: None)
    for msg in (LoraLoad(request_id="l", name="a", path="/p"),
                WeightsUpdate(request_id="w", path="/p"), MemoryRelease(request_id="m")):
        with pytest.raises(NotSupported):
            engine.submit(msg, lambda _: None)
