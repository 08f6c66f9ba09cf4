"""Which reasoner job runs next, and which decode jobs share its forward.

Pure CPU logic, no torch: jobs wait in one FIFO; `schedule()` takes the head job and, when
batch decoding is on and the head is decoding, up to `max_decode_batch - 1` other decoding jobs
in queue order, so they run one decode step in one forward; likewise, when the head is a new
frame to prefill (`batchable_prefill`), the other new frames waiting, so their prefill groups
share one forward. `update()` puts unfinished jobs back
at the end, so a long prefill of one session delays another by at most one unit.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

MAX_DECODE_BATCH = 16


class JobPhase(enum.Enum):
    QUEUED = "queued"
    PREFILL = "prefill"
    DECODE = "decode"
    DONE = "done"


class Job(Protocol):
    request_id: str
    phase: JobPhase


@dataclass
class ReasonerBatch:
    """The scheduler's output for one step: jobs that run one unit each in this step."""

    jobs: list[Job]
    prefill: bool = False  # several jobs' prefill groups (else decode steps when batched)

    @property
    def batched_decode(self) -> bool:
        """Several decode jobs sharing one forward (else: one unit of one job)."""
        return len(self.jobs) > 1 and not self.prefill

    @property
    def batched_prefill(self) -> bool:
        """Several new frames' prefill groups sharing one forward."""
        return len(self.jobs) > 1 and self.prefill


def _decoding(job: Job) -> bool:
    return job.phase is JobPhase.DECODE


def _batchable_prefill(job: Job) -> bool:
    return bool(getattr(job, "batchable_prefill", False))


class ReasonerScheduler:
    def __init__(self, batch_decode: bool, max_decode_batch: int = MAX_DECODE_BATCH) -> None:
        self.batch_decode = batch_decode
        self.max_decode_batch = max_decode_batch
        self.queue: deque[Job] = deque()

    def __len__(self) -> int:
        return len(self.queue)

    def __iter__(self) -> Iterator[Job]:
        return iter(self.queue)

    def add(self, job: Job) -> None:
        self.queue.append(job)

    def remove_where(self, predicate: Callable[[Job], bool]) -> list[Job]:
        """Take the matching jobs out of the queue (cancellation, a closed session)."""
        taken = [job for job in self.queue if predicate(job)]
        for job in taken:
            self.queue.remove(job)
        return taken

    def num_started(self) -> int:
        return sum(1 for job in self.queue if job.phase is not JobPhase.QUEUED)

    def schedule(self) -> ReasonerBatch | None:
        """The next step's jobs (taken out of the queue), or None when there is nothing to do."""
        if not self.queue:
            return None
        head = self.queue.popleft()
        jobs = [head]
        prefill = self.batch_decode and _batchable_prefill(head)
        if self.batch_decode and (prefill or head.phase is JobPhase.DECODE):
            joins = _batchable_prefill if prefill else _decoding
            partners = [j for j in self.queue if joins(j)]
            jobs += partners[:self.max_decode_batch - 1]
            for job in jobs[1:]:
                self.queue.remove(job)
        return ReasonerBatch(jobs, prefill=prefill)

    def update(self, batch: ReasonerBatch) -> None:
        """After the step: unfinished jobs go back to the end of the queue."""
        self.queue.extend(job for job in batch.jobs if job.phase is not JobPhase.DONE)

    def clear(self) -> None:
        self.queue.clear()
