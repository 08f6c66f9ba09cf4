"""Scheduler: batching rules, batching window, cancellation, solo retries (fabricated requests)."""

from __future__ import annotations

import pytest

from worldserve.engines.generation.scheduler import (
    RequestStatus,
    ScheduledRequest,
    Scheduler,
    denoise_progress,
)
from worldserve.ipc.messages import GenerationParams


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def params(width: int = 64, steps: int = 4, seeds: tuple[int, ...] = (1,), cond: bool = False):
    return GenerationParams(prompt="p", width=width, height=64, num_frames=9,
                            num_inference_steps=steps, guidance_scale=1.0, seeds=list(seeds),
                            condition_images=[b"x"] if cond else [])


def make(sched: Scheduler, rid: str, **kw) -> ScheduledRequest:
    req = ScheduledRequest(request_id=rid, params=params(**kw), arrival_s=sched.clock())
    sched.add(req)
    return req


def ids(batch):
    return [r.request_id for r in batch]


def test_compatible_requests_batch_up_to_max_rows():
    clock = Clock()
    sched = Scheduler(max_batch_size=4, batch_wait_s=0.01, clock=clock)
    make(sched, "a")
    make(sched, "b", width=128)  # incompatible size
    make(sched, "c", seeds=(1, 2))
    make(sched, "d")
    make(sched, "e")
    batch = sched.schedule()
    assert ids(batch) == ["a", "c", "d"]  # 4 rows: a(1) + c(2) + d(1)
    assert all(r.status == RequestStatus.RUNNING for r in batch)
    assert ids(sched.waiting) == ["b", "e"]


def test_head_waits_for_partners_until_window_closes():
    clock = Clock()
    sched = Scheduler(max_batch_size=4, batch_wait_s=0.01, clock=clock)
    make(sched, "a")
    assert sched.schedule() is None
    assert sched.wait_s() == pytest.approx(0.01)
    clock.now = 0.005
    make(sched, "b")
    assert sched.schedule() is None
    clock.now = 0.011
    assert ids(sched.schedule()) == ["a", "b"]


def test_full_batch_and_conditioned_requests_start_at_once():
    clock = Clock()
    sched = Scheduler(max_batch_size=2, batch_wait_s=10.0, clock=clock)
    make(sched, "cond", cond=True)
    assert ids(sched.schedule()) == ["cond"]  # never batched, never waits
    make(sched, "a")
    make(sched, "b")
    assert ids(sched.schedule()) == ["a", "b"]


def test_different_steps_do_not_batch():
    sched = Scheduler(max_batch_size=4, batch_wait_s=0.0, clock=Clock())
    make(sched, "a", steps=4)
    make(sched, "b", steps=8)
    assert ids(sched.schedule()) == ["a"]
    assert ids(sched.schedule()) == ["b"]


def test_remove_and_requeue_alone():
    sched = Scheduler(max_batch_size=4, batch_wait_s=0.0, clock=Clock())
    make(sched, "a")
    make(sched, "b")
    make(sched, "c")
    assert sched.remove("b").request_id == "b"
    assert sched.remove("zzz") is None
    batch = sched.schedule()
    assert ids(batch) == ["a", "c"]
    sched.requeue_alone(batch)
    assert [r.solo for r in sched.waiting] == [True, True]
    assert ids(sched.schedule()) == ["a"]
    assert ids(sched.schedule()) == ["c"]


def test_illegal_transition_raises():
    sched = Scheduler(max_batch_size=1, batch_wait_s=0.0, clock=Clock())
    req = make(sched, "a")
    req.transition(RequestStatus.CANCELLED)
    with pytest.raises(RuntimeError):
        req.transition(RequestStatus.RUNNING)


def test_progress_rule():
    assert denoise_progress(0, 4) == 1
    assert denoise_progress(2, 4) == 45
    assert denoise_progress(4, 4) == 90
    values = [denoise_progress(i, 7) for i in range(8)]
    assert values == sorted(values)
