"""Scheduler: batching rules, batching window, running batches, cancellation, solo retries, pause
and drain (fabricated requests)."""

from __future__ import annotations

import pytest

from worldserve.engines.generation.batch import RequestStatus, ScheduledRequest
from worldserve.engines.generation.scheduler import PauseState, Scheduler, denoise_progress
from worldserve.ipc.messages import GenerateActions, GenerationParams, LoraRef


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def params(width: int = 64, steps: int = 4, seeds: tuple[int, ...] = (1,), cond: bool = False,
           lora: str | None = None):
    return GenerationParams(prompt="p", width=width, height=64, num_frames=9,
                            num_inference_steps=steps, guidance_scale=1.0, seeds=list(seeds),
                            condition_images=[b"x"] if cond else [],
                            lora=[LoraRef(name=lora)] if lora else [])


def make(sched: Scheduler, rid: str, **kw) -> ScheduledRequest:
    req = ScheduledRequest(request_id=rid, params=params(**kw), arrival_s=sched.clock())
    sched.add(req)
    return req


def ids(requests) -> list[str]:
    return [r.request_id for r in requests]


def started(sched: Scheduler) -> list[str] | None:
    """Ids of the batch `schedule()` starts now (None: it starts none)."""
    before = list(sched.running)
    out = sched.schedule()
    if out is None or out.batch is None or out.batch in before:
        return None
    return ids(out.batch.requests)


def test_compatible_requests_batch_up_to_max_rows():
    sched = Scheduler(max_batch_size=4, batch_wait_s=0.01, clock=Clock())
    make(sched, "a")
    make(sched, "b", width=128)  # incompatible size
    make(sched, "c", seeds=(1, 2))
    make(sched, "d")
    make(sched, "e")
    assert started(sched) == ["a", "c", "d"]  # 4 rows: a(1) + c(2) + d(1)
    assert all(sched.requests[rid].status == RequestStatus.RUNNING for rid in "acd")
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
    assert started(sched) == ["a", "b"]


def test_full_batch_and_conditioned_requests_start_at_once():
    sched = Scheduler(max_batch_size=2, batch_wait_s=10.0, clock=Clock())
    make(sched, "cond", cond=True)
    assert started(sched) == ["cond"]  # never batched, never waits
    make(sched, "a")
    make(sched, "b")
    assert started(sched) == ["a", "b"]


def test_different_steps_do_not_batch_and_run_side_by_side():
    sched = Scheduler(max_batch_size=4, batch_wait_s=0.0, clock=Clock())
    make(sched, "a", steps=4)
    make(sched, "b", steps=8)
    assert started(sched) == ["a"]
    assert started(sched) == ["b"]
    assert [ids(b.requests) for b in sched.running] == [["a"], ["b"]]


def test_compatible_requests_gather_behind_their_running_batch():
    """The batching regression: a request compatible with a running (partial) batch does not
    start a second partial batch beside it; it waits, and the ones that arrive meanwhile start
    together once that batch is done. An incompatible request is not held up."""
    sched = Scheduler(max_batch_size=4, batch_wait_s=0.0, clock=Clock())
    first = make(sched, "a")
    assert started(sched) == ["a"]
    make(sched, "b")
    make(sched, "wide", width=128)
    assert started(sched) == ["wide"]  # b is held; the incompatible one starts beside a
    make(sched, "c")
    assert sched.schedule().batch.requests[0].request_id in ("a", "wide")  # round-robin only
    sched.finish(first, RequestStatus.FINISHED)
    assert started(sched) == ["b", "c"]


def test_compatible_requests_that_fill_a_batch_start_beside_their_key():
    sched = Scheduler(max_batch_size=2, batch_wait_s=0.0, clock=Clock())
    make(sched, "a")
    assert started(sched) == ["a"]
    make(sched, "b")
    make(sched, "c")
    assert started(sched) == ["b", "c"]


def test_max_running_requests_bounds_admission():
    sched = Scheduler(max_batch_size=1, batch_wait_s=0.0, max_running_requests=2, clock=Clock())
    for rid in "abc":
        make(sched, rid)
    assert started(sched) == ["a"]
    assert started(sched) == ["b"]
    assert started(sched) is None  # full: the running batches advance instead
    assert ids(sched.waiting) == ["c"]


def test_abort_and_solo_retries():
    sched = Scheduler(max_batch_size=4, batch_wait_s=0.0, clock=Clock())
    for rid in "abc":
        make(sched, rid)
    assert sched.abort("b").status == RequestStatus.CANCELLED
    assert sched.abort("zzz") is None and "b" not in sched.requests
    batch = sched.schedule().batch
    assert ids(batch.requests) == ["a", "c"]
    assert sched.batch_failed(batch) == []  # several: each retried alone
    assert [r.solo for r in sched.waiting] == [True, True] and not sched.running
    assert started(sched) == ["a"]
    assert started(sched) == ["c"]
    alone = sched.running[0]
    assert ids(sched.batch_failed(alone)) == ["a"]  # alone: it fails
    assert sched.requests.keys() == {"c"}


def test_paused_all_runs_nothing_and_paused_new_drains():
    sched = Scheduler(max_batch_size=1, batch_wait_s=0.0, clock=Clock())
    make(sched, "a")
    assert started(sched) == ["a"]
    make(sched, "b")
    action = (GenerateActions(request_id="act"), lambda reply: None)
    sched.set_pause_state(PauseState.PAUSED_ALL)
    sched.add_action(action)
    assert sched.schedule() is None and not sched.has_work()
    sched.set_pause_state(PauseState.PAUSED_NEW)
    assert sched.schedule().action is action  # actions still run while draining
    assert ids(sched.schedule().batch.requests) == ["a"]  # running batches finish ...
    assert started(sched) is None  # ... but no new batch starts
    sched.finish(sched.requests["a"], RequestStatus.FINISHED)
    assert not sched.has_work() and ids(sched.waiting) == ["b"]
    sched.set_pause_state(PauseState.UNPAUSED)
    assert started(sched) == ["b"]


def test_fail_waiting_leaves_running_work_alone():
    sched = Scheduler(max_batch_size=1, batch_wait_s=0.0, clock=Clock())
    make(sched, "a", lora="x")
    assert started(sched) == ["a"]
    make(sched, "b", lora="x")
    sched.add_action((GenerateActions(request_id="act", lora=[LoraRef(name="x")]), print))
    assert sched.users_of("x") == ["a", "b", "act"]
    failed, actions = sched.fail_waiting()
    assert ids(failed) == ["b"] and failed[0].status == RequestStatus.FAILED
    assert [msg.request_id for msg, _ in actions] == ["act"]
    assert sched.users_of("x") == ["a"] and len(sched.running) == 1


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
