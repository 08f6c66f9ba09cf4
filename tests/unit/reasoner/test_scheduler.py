"""Reasoner scheduler: round-robin order, decode batching, requeue, removal (fabricated jobs)."""

from __future__ import annotations

from dataclasses import dataclass

from worldserve.engines.reasoner.scheduler import JobPhase, ReasonerScheduler


@dataclass(eq=False)
class FakeJob:
    request_id: str
    phase: JobPhase = JobPhase.QUEUED


def ids(jobs) -> list[str]:
    return [job.request_id for job in jobs]


def queue(*jobs: FakeJob, batch_decode: bool = True, max_decode_batch: int = 16):
    sched = ReasonerScheduler(batch_decode, max_decode_batch)
    for job in jobs:
        sched.add(job)
    return sched


def test_empty_queue_schedules_nothing():
    assert ReasonerScheduler(True).schedule() is None


def test_unfinished_jobs_go_to_the_back_round_robin():
    a, b = FakeJob("a", JobPhase.PREFILL), FakeJob("b", JobPhase.PREFILL)
    sched = queue(a, b)
    order = []
    for _ in range(4):
        batch = sched.schedule()
        order += ids(batch.jobs)
        sched.update(batch)
    assert order == ["a", "b", "a", "b"]


def test_decode_jobs_share_one_step_up_to_the_cap_in_queue_order():
    jobs = [FakeJob("p", JobPhase.PREFILL)] + [FakeJob(f"d{i}", JobPhase.DECODE) for i in range(4)]
    sched = queue(*jobs, max_decode_batch=3)
    assert ids(sched.schedule().jobs) == ["p"]  # a prefill head runs alone
    batch = sched.schedule()
    assert batch.batched_decode and ids(batch.jobs) == ["d0", "d1", "d2"]
    assert ids(sched) == ["d3"]


def test_batching_off_runs_one_job_per_step():
    sched = queue(FakeJob("a", JobPhase.DECODE), FakeJob("b", JobPhase.DECODE),
                  batch_decode=False)
    batch = sched.schedule()
    assert ids(batch.jobs) == ["a"] and not batch.batched_decode


def test_finished_jobs_leave_and_removal_takes_matching_jobs():
    a, b, c = FakeJob("a", JobPhase.DECODE), FakeJob("b"), FakeJob("c")
    sched = queue(a, b, c)
    batch = sched.schedule()
    a.phase = JobPhase.DONE
    sched.update(batch)
    assert ids(sched) == ["b", "c"]
    assert ids(sched.remove_where(lambda job: job.request_id == "c")) == ["c"]
    assert ids(sched) == ["b"] and sched.num_started() == 0
