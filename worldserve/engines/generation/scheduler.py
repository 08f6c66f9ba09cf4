"""Which generation work runs next: the scheduler owns every unfinished request.

Pure CPU logic, no torch. The scheduler holds the waiting queue, the running batches (advanced
round-robin, one phase per engine step, at most `max_running_requests` requests running), the
action queue and the pause state; nothing outside it touches them (the engine and the admin
operations call its methods, vLLM's `Scheduler` shape).

Batching: compatible requests (same size, frames, steps, guidance, sequence length, LoRA
selection; no conditioning image) share a batch of at most `max_batch_size` output rows; the
oldest waiting request waits at most `batch_wait_s` for partners. Compatible requests never
split into two partial batches that run at once: while a batch of their key runs they wait
and start together after it (as one batch, instead of several that each repeat every forward),
unless they fill a batch already. Incompatible requests start beside running batches, so a
short request is not stuck behind a long one. A request that failed inside a batch is retried
alone (`solo`), so one bad request never fails its neighbours.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from typing import Callable

from worldserve.engines.generation.batch import (
    ActionJob,
    RequestStatus,
    RunningBatch,
    ScheduledRequest,
    SchedulerOutput,
)


class PauseState(enum.Enum):
    """What the scheduler may start (vLLM's `PauseState`)."""

    UNPAUSED = "unpaused"
    PAUSED_NEW = "paused_new"  # draining: running batches and actions go on, no new batch starts
    PAUSED_ALL = "paused_all"  # nothing runs: running batches hold at this step boundary


class Scheduler:
    """FIFO with batching of compatible requests, several running batches, pause and drain."""

    def __init__(self, max_batch_size: int, batch_wait_s: float, max_running_requests: int = 4,
                 clock: Callable[[], float] | None = None) -> None:
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.max_running_requests = max_running_requests
        self.clock = clock or time.monotonic
        self.waiting: deque[ScheduledRequest] = deque()
        self.running: list[RunningBatch] = []
        self.actions: deque[ActionJob] = deque()
        self.requests: dict[str, ScheduledRequest] = {}  # every waiting or running request
        self.pause_state = PauseState.UNPAUSED
        self._turn = 0  # round-robin cursor over `running`

    def __len__(self) -> int:
        return len(self.waiting)

    # ------------------------------------------------------------------ queueing

    def add(self, request: ScheduledRequest) -> int:
        """Queue `request`; returns its position (0 = next)."""
        self.requests[request.request_id] = request
        self.waiting.append(request)
        return len(self.waiting) - 1

    def add_action(self, action: ActionJob) -> None:
        self.actions.append(action)

    def set_pause_state(self, state: PauseState) -> None:
        self.pause_state = state

    @property
    def paused(self) -> bool:
        return self.pause_state is PauseState.PAUSED_ALL

    def has_work(self) -> bool:
        """Whether `schedule()` can return something (now or once a batching window closes)."""
        if self.pause_state is PauseState.PAUSED_ALL:
            return False
        startable = self.waiting and self.pause_state is PauseState.UNPAUSED
        return bool(self.running or self.actions or startable)

    def num_running(self) -> int:
        return sum(len(batch.requests) for batch in self.running)

    def users_of(self, lora_name: str) -> list[str]:
        """Ids of the queued or running requests (and actions) that select adapter `lora_name`."""
        users = [rid for rid, request in self.requests.items()
                 if any(ref.name == lora_name for ref in request.params.lora)]
        users += [msg.request_id for msg, _ in self.actions
                  if any(ref.name == lora_name for ref in msg.lora)]
        return users

    # ------------------------------------------------------------------ schedule

    def schedule(self, admit: bool = True) -> SchedulerOutput | None:
        """Actions first; then a new batch while there is room (and `admit`); else the next
        running batch, round-robin. None: nothing may run now."""
        if self.pause_state is PauseState.PAUSED_ALL:
            return None
        if self.actions:
            return SchedulerOutput(action=self.actions.popleft())
        batch = (self._admit() if admit else None) or self._next_running()
        if batch is None:
            return None
        return SchedulerOutput(batch=batch, phase=batch.phase())

    def _admit(self) -> RunningBatch | None:
        room = self.max_running_requests - self.num_running()
        if room <= 0 or self.pause_state is not PauseState.UNPAUSED:
            return None
        requests = self.take_batch(max_requests=room)
        if requests is None:
            return None
        batch = RunningBatch(requests)
        self.running.append(batch)
        return batch

    def _next_running(self) -> RunningBatch | None:
        if not self.running:
            return None
        self._turn %= len(self.running)
        batch = self.running[self._turn]
        self._turn += 1
        return batch

    def take_batch(self, max_requests: int | None = None) -> list[ScheduledRequest] | None:
        """The next batch of at most `max_requests` requests (marked RUNNING and dequeued), or
        None when nothing may start yet."""
        head = self._head()
        if head is None or self._window_s(head) > 0:
            return None
        batch = self._partners(head, max_requests)
        for request in batch:
            self.waiting.remove(request)
            request.transition(RequestStatus.RUNNING)
        return batch

    def wait_s(self) -> float:
        """Seconds until the head request's batching window closes (0 when it may run now)."""
        head = self._head()
        return 0.0 if head is None else self._window_s(head)

    def _head(self) -> ScheduledRequest | None:
        """The oldest waiting request that may start a batch now: one whose key no running
        batch has, or whose batch would be full already."""
        running = {key for key in (batch.key for batch in self.running) if key is not None}
        for request in self.waiting:
            if request.key not in running or self._full(self._partners(request)):
                return request
        return None

    def _window_s(self, head: ScheduledRequest) -> float:
        if head.key is None or self._full(self._partners(head)):
            return 0.0
        return max(0.0, head.arrival_s + self.batch_wait_s - self.clock())

    def _full(self, requests: list[ScheduledRequest]) -> bool:
        return sum(r.num_rows for r in requests) >= self.max_batch_size

    def _partners(self, head: ScheduledRequest,
                  max_requests: int | None = None) -> list[ScheduledRequest]:
        chosen, rows, key = [head], head.num_rows, head.key
        if key is None:
            return chosen
        for request in self.waiting:
            if rows >= self.max_batch_size or len(chosen) == max_requests:
                break
            if (request is not head and request.key == key
                    and rows + request.num_rows <= self.max_batch_size):
                chosen.append(request)
                rows += request.num_rows
        return chosen

    # ------------------------------------------------------------------ endings

    def finish(self, request: ScheduledRequest, status: RequestStatus) -> None:
        """`request` ends with `status` (finished, failed, cancelled): it leaves its queue or
        batch and the scheduler."""
        request.transition(status)
        if request in self.waiting:
            self.waiting.remove(request)
        for batch in self.running:
            if request in batch.requests:
                batch.drop(request)
                if not batch.requests:
                    self.running.remove(batch)
                break
        self.requests.pop(request.request_id, None)

    def abort(self, request_id: str) -> ScheduledRequest | None:
        """Cancel a waiting or running request; None when it is not here (any more)."""
        request = self.requests.get(request_id)
        if request is None or request.status not in (RequestStatus.WAITING,
                                                     RequestStatus.RUNNING):
            return None
        self.finish(request, RequestStatus.CANCELLED)
        return request

    def batch_failed(self, batch: RunningBatch) -> list[ScheduledRequest]:
        """A batch raised: several requests are requeued at the front, each to run alone (returns
        []); a single request fails (returned, out of the scheduler)."""
        if batch in self.running:
            self.running.remove(batch)
        if len(batch.requests) > 1:
            self.requeue_alone(batch.requests)
            return []
        for request in batch.requests:
            request.transition(RequestStatus.FAILED)
            self.requests.pop(request.request_id, None)
        return list(batch.requests)

    def requeue_alone(self, requests: list[ScheduledRequest]) -> None:
        """Put requests of a failed batch back at the front, each to run alone."""
        for request in reversed(requests):
            request.transition(RequestStatus.WAITING)
            request.solo = True
            request.steps_done = 0
            self.waiting.appendleft(request)

    def fail_waiting(self) -> tuple[list[ScheduledRequest], list[ActionJob]]:
        """Fail every queued (not yet running) request and action; returns them to answer."""
        failed = list(self.waiting)
        self.waiting.clear()
        for request in failed:
            request.transition(RequestStatus.FAILED)
            self.requests.pop(request.request_id, None)
        actions = list(self.actions)
        self.actions.clear()
        return failed, actions

    def drop_all(self) -> list[ScheduledRequest]:
        """Forget every request (shutdown); returns them to answer."""
        dropped = list(self.requests.values())
        self.requests.clear()
        self.waiting.clear()
        self.running.clear()
        return dropped


def denoise_progress(steps_done: int, steps_total: int) -> int:
    """Spec rule: 1 + floor(89 * done / total) while denoising (1..90)."""
    if steps_total <= 0:
        return 90
    return 1 + (89 * min(steps_done, steps_total)) // steps_total

