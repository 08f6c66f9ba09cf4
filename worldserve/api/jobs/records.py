"""`JobRecord`: one image request or video job as the api stores it (spec native-media.md §4.3).

Status machine: queued -> in_progress -> completed | failed | cancelled; terminal states never
change (`JobStatus.can_move_to`). The record is stored as JSON under the same keys as before
(`_kind`, `_seq` included), so records written by earlier versions still load.
"""

from __future__ import annotations

import enum
from typing import Any, Literal

import msgspec

JobKind = Literal["image", "video"]


class JobStatus(str, enum.Enum):
    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_live(self) -> bool:
        return self in LIVE_STATUSES

    def can_move_to(self, status: JobStatus) -> bool:
        return status in _TRANSITIONS.get(self, frozenset())


LIVE_STATUSES = (JobStatus.QUEUED, JobStatus.IN_PROGRESS)
TERMINAL_STATUSES = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)
_TRANSITIONS = {
    JobStatus.QUEUED: frozenset({JobStatus.IN_PROGRESS, *TERMINAL_STATUSES}),
    JobStatus.IN_PROGRESS: frozenset(TERMINAL_STATUSES),
}


class JobError(msgspec.Struct):
    """The public `error` object of a failed or cancelled job."""

    message: str
    code: str


class JobRecord(msgspec.Struct, kw_only=True):
    id: str
    kind: JobKind = msgspec.field(name="_kind")
    created_at: int
    size: str  # WIDTHxHEIGHT, the stage's answer once accepted
    status: JobStatus = JobStatus.QUEUED
    progress: int = 0
    # Where the engine is (its progress replies): `queue_position` requests ahead while queued
    # (None once admitted); `phase` (encode, denoise, decode, mux) and denoising `step` of
    # `total_steps` while in progress; `queue_wait_s` from acceptance to admission.
    queue_position: int | None = None
    phase: str | None = None
    step: int = 0
    total_steps: int = 0
    queue_wait_s: float | None = None
    completed_at: int | None = None
    expires_at: int | None = None
    error: JobError | None = None
    num_outputs: int = 1
    file_names: list[str] = []
    revised_prompt: str | None = None
    output_format: str = ""
    seq: int = msgspec.field(default=0, name="_seq")  # insertion order among equal created_at
    # videos
    model: str | None = None
    stage_request_id: str | None = None
    num_frames: int | None = None
    seconds: str = "0"
    remixed_from_video_id: str | None = None  # POST /v1/videos/{id}/remix: the source job
    # forward dynamics: the rows the job rolls out; policy / inverse dynamics: the predicted ones
    action: dict[str, Any] | None = None
    # images
    num_input_images: int = 0
    response_format: str | None = None
    # filled on completion
    inference_time_s: float | None = None
    peak_memory_mb: float | None = None
    stage_durations: dict[str, float] = {}  # seconds per phase (encode, denoise, decode, mux)
    # step caching: {method, num_forwards, num_forwards_skipped}; None: the job did not cache
    step_cache: dict[str, Any] | None = None

    def to_json(self) -> bytes:
        return msgspec.json.encode(self)

    @staticmethod
    def from_json(data: str | bytes) -> JobRecord:
        return msgspec.json.decode(data, type=JobRecord)
