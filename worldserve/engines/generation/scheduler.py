"""Which generation requests run next, and together.

Pure CPU logic, no torch: the engine asks `schedule(max_requests)` for a new batch whenever it
has room for more running requests (several batches may run at once). Compatible requests
(same size, frames, steps, guidance, sequence length, LoRA selection; no conditioning
image) share a batch of at most `max_batch_size` output rows; the oldest waiting request waits
at most `batch_wait_s` for partners. A request that failed inside a batch is retried alone
(`solo`), so one bad request never fails its neighbours.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

from worldserve.ipc.messages import GenerationParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"


_ALLOWED = {
    RequestStatus.WAITING: {RequestStatus.RUNNING, RequestStatus.CANCELLED, RequestStatus.FAILED},
    RequestStatus.RUNNING: {RequestStatus.FINISHED, RequestStatus.FAILED, RequestStatus.CANCELLED,
                            RequestStatus.WAITING},  # WAITING: requeued alone after a batch failure
}


def batch_key(params: GenerationParams) -> Hashable | None:
    """Requests with equal keys can share a batch; None means "always alone"."""
    if params.condition_images:
        return None
    return (params.width, params.height, params.num_frames, params.num_inference_steps,
            params.guidance_scale, params.guidance_scale_2, params.max_sequence_length,
            params.flow_shift, tuple((ref.name, ref.scale) for ref in params.lora))


@dataclass(eq=False)
class ScheduledRequest:
    """One request as the scheduler and engine track it. `payload` is the engine's business."""

    request_id: str
    params: GenerationParams
    arrival_s: float
    payload: Any = None
    solo: bool = False
    status: RequestStatus = RequestStatus.WAITING
    steps_done: int = 0
    last_progress: int = 0
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return len(self.params.seeds)

    @property
    def key(self) -> Hashable | None:
        return None if self.solo else batch_key(self.params)

    def transition(self, status: RequestStatus) -> None:
        if status not in _ALLOWED.get(self.status, set()):
            raise RuntimeError(f"request {self.request_id}: illegal transition "
                               f"{self.status.value} -> {status.value}")
        self.status = status


class Scheduler:
    """FIFO with batching of compatible requests."""

    def __init__(self, max_batch_size: int, batch_wait_s: float,
                 clock: Callable[[], float] | None = None) -> None:
        import time

        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.clock = clock or time.monotonic
        self.waiting: deque[ScheduledRequest] = deque()

    def __len__(self) -> int:
        return len(self.waiting)

    def add(self, request: ScheduledRequest) -> int:
        """Queue `request`; returns its position (0 = next)."""
        self.waiting.append(request)
        return len(self.waiting) - 1

    def requeue_alone(self, requests: list[ScheduledRequest]) -> None:
        """Put requests of a failed batch back at the front, each to run alone."""
        for request in reversed(requests):
            request.transition(RequestStatus.WAITING)
            request.solo = True
            request.steps_done = 0
            self.waiting.appendleft(request)

    def remove(self, request_id: str) -> ScheduledRequest | None:
        """Take a waiting request out of the queue (cancellation); None when not waiting."""
        for request in self.waiting:
            if request.request_id == request_id:
                self.waiting.remove(request)
                return request
        return None

    def _partners(self, head: ScheduledRequest,
                  max_requests: int | None = None) -> list[ScheduledRequest]:
        chosen, rows = [head], head.num_rows
        if head.key is None:
            return chosen
        for request in list(self.waiting)[1:]:
            if rows >= self.max_batch_size or len(chosen) == max_requests:
                break
            if request.key == head.key and rows + request.num_rows <= self.max_batch_size:
                chosen.append(request)
                rows += request.num_rows
        return chosen

    def wait_s(self) -> float:
        """Seconds until the head request's batching window closes (0 when it may run now)."""
        if not self.waiting:
            return 0.0
        head = self.waiting[0]
        if head.key is None or sum(r.num_rows for r in self._partners(head)) >= self.max_batch_size:
            return 0.0
        return max(0.0, head.arrival_s + self.batch_wait_s - self.clock())

    def schedule(self, max_requests: int | None = None) -> list[ScheduledRequest] | None:
        """The next batch of at most `max_requests` requests (marked RUNNING and dequeued), or
        None when nothing may start yet."""
        if not self.waiting or self.wait_s() > 0:
            return None
        batch = self._partners(self.waiting[0], max_requests)
        for request in batch:
            self.waiting.remove(request)
            request.transition(RequestStatus.RUNNING)
        return batch


def denoise_progress(steps_done: int, steps_total: int) -> int:
    """Spec rule: 1 + floor(89 * done / total) while denoising (1..90)."""
    if steps_total <= 0:
        return 90
    return 1 + (89 * min(steps_done, steps_total)) // steps_total
