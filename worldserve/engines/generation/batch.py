"""The generation engine's vocabulary (vLLM's Request / SchedulerOutput / RunnerOutput, one phase
at a time): a request as the scheduler tracks it, the batches that denoise together, which
batch advances next and which runner phase it runs, and what that phase produced."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Hashable

import numpy as np

from worldserve.engines.generation.contract import RunnerBatch
from worldserve.ipc.messages import ActionsResult, GenerateActions, GenerateMedia, GenerationParams
from worldserve.models.types import RowExtras, StepCacheStats
from worldserve.runtime.engine import ReplyFn


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
            params.flow_shift, tuple((ref.name, ref.scale) for ref in params.lora),
            params.step_cache)


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


@dataclass
class MediaJob:
    """Engine-side payload of a ScheduledRequest."""

    msg: GenerateMedia | None  # None for internal (warmup) requests
    reply: ReplyFn
    started_s: float = 0.0
    # seconds this request spent in each phase (STAGE_KEYS), wall time of the steps it was in
    durations: dict[str, float] = field(default_factory=dict)


class Phase(enum.Enum):
    PREPARE = "prepare"  # encode prompts, sample noise
    DENOISE = "denoise"  # one denoising step of every row
    DECODE = "decode"  # one row's VAE decode
    WRITE = "write"  # one request's output files and result


# The result's `stage_durations` keys per phase (vLLM-Omni's names).
STAGE_KEYS = {Phase.PREPARE: "encode", Phase.DENOISE: "denoise", Phase.DECODE: "decode",
              Phase.WRITE: "mux"}


@dataclass(eq=False)
class RunningBatch:
    """Requests that denoise together; `state` is the runner's tensors once prepared."""

    requests: list[ScheduledRequest]
    state: RunnerBatch | None = None
    decoded: dict[int, np.ndarray] = field(default_factory=dict)  # row -> uint8 frames
    extras: dict[int, RowExtras | None] = field(default_factory=dict)  # row -> sound, actions
    cache_stats: dict[int, StepCacheStats | None] = field(default_factory=dict)  # row -> forwards
    next_row: int = 0

    @property
    def num_rows(self) -> int:
        return sum(r.num_rows for r in self.requests)

    @property
    def key(self) -> Hashable | None:
        """The batch key its requests share (None: a request that runs alone)."""
        return self.requests[0].key if self.requests else None

    def phase(self) -> Phase:
        if self.state is None:
            return Phase.PREPARE
        if not self.state.done_denoising:
            return Phase.DENOISE
        if self.next_row < len(self.state.row_owner):
            return Phase.DECODE
        return Phase.WRITE

    def account(self, phase: Phase, seconds: float) -> None:
        """Add a phase's wall time to the requests it ran for (a decode: the row's owner; a
        write: the request written; a prepare or denoise step: every request of the batch)."""
        if self.state is None:
            return
        if phase is Phase.DECODE:
            owner = self.state.row_owner[self.next_row]
            requests = [r for r in self.requests if r.request_id == owner]
        elif phase is Phase.WRITE:
            requests = self.requests[:1]
        else:
            requests = self.requests
        key = STAGE_KEYS[phase]
        for request in requests:
            durations = request.payload.durations
            durations[key] = durations.get(key, 0.0) + seconds

    def rows_of(self, request_id: str) -> list[int]:
        assert self.state is not None
        return [i for i, owner in enumerate(self.state.row_owner) if owner == request_id]

    def drop(self, request: ScheduledRequest) -> None:
        """Take `request` (and its rows) out of the batch."""
        self.requests = [r for r in self.requests if r is not request]
        if self.state is None:
            return
        keep = [i for i, owner in enumerate(self.state.row_owner) if owner != request.request_id]
        self.decoded = {keep.index(i): v for i, v in self.decoded.items() if i in keep}
        self.extras = {keep.index(i): v for i, v in self.extras.items() if i in keep}
        self.next_row = sum(1 for i in keep if i < self.next_row)
        self.state.keep_rows(keep)


ActionJob = tuple[GenerateActions, ReplyFn]


@dataclass
class SchedulerOutput:
    """What one engine step runs: one phase of one running batch, or one action request."""

    batch: RunningBatch | None = None
    phase: Phase | None = None
    action: ActionJob | None = None


@dataclass
class RunnerOutput:
    """What the executed phase produced (the update step turns it into replies)."""

    frames: np.ndarray | None = None  # DECODE: uint8 (T, H, W, 3) of the decoded row
    extras: RowExtras | None = None  # DECODE: the row's sound and actions
    file_names: list[str] = field(default_factory=list)  # WRITE
    actions: ActionsResult | None = None  # action request
