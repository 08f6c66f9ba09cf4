"""The generation engine's step vocabulary (vLLM's SchedulerOutput / RunnerOutput, one phase at a
time): which running batch advances, which runner phase it runs, and what that phase produced."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from worldserve.engines.generation.contract import RunnerBatch
from worldserve.engines.generation.scheduler import ScheduledRequest
from worldserve.ipc.messages import ActionsResult, GenerateActions, GenerateMedia
from worldserve.models.types import RowExtras
from worldserve.runtime.engine import ReplyFn


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
    next_row: int = 0

    @property
    def num_rows(self) -> int:
        return sum(r.num_rows for r in self.requests)

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


@dataclass
class SchedulerOutput:
    """What one engine step runs: one phase of one running batch, or one action request."""

    batch: RunningBatch | None = None
    phase: Phase | None = None
    action: tuple[GenerateActions, ReplyFn] | None = None


@dataclass
class RunnerOutput:
    """What the executed phase produced (the update step turns it into replies)."""

    frames: np.ndarray | None = None  # DECODE: uint8 (T, H, W, 3) of the decoded row
    extras: RowExtras | None = None  # DECODE: the row's sound and actions
    file_names: list[str] = field(default_factory=list)  # WRITE
    actions: ActionsResult | None = None  # action request
