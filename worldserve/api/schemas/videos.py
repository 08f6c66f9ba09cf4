"""Public schemas of the video job routes (spec native-media.md §4)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, field_validator

from worldserve.api.schemas.images import SamplingFields


class VideoCreateRequest(SamplingFields):
    input_reference: str | None = None
    reference_url: str | None = None
    video_path: str | None = None
    video_url: str | None = None
    seconds: int | None = None
    fps: int | None = None
    num_frames: int | None = None
    enable_frame_interpolation: bool | None = False
    frame_interpolation_exp: int | None = 1
    frame_interpolation_scale: float | None = 1.0
    # Fields a model must declare (spec §4.1 "Cosmos3 fields"): api/jobs/params.py.
    generate_sound: bool | None = None
    sound_duration: float | None = None
    condition_frame_indexes: list[int] | None = None
    condition_frame_indexes_vision: list[int] | None = None
    condition_video_keep: str | None = None
    action_mode: str | None = None
    domain_id: int | None = None
    domain_name: str | None = None
    raw_action_dim: int | None = None
    action_fps: float | None = None
    action: list[list[float]] | None = None
    action_view_point: str | None = None
    action_normalization: str | None = None
    resolution_tier: int | None = None

    @field_validator("condition_frame_indexes", "condition_frame_indexes_vision", "action",
                     mode="before")
    @classmethod
    def _json_string(cls, value: Any) -> Any:
        # Multipart forms carry lists as JSON text ("[0, 1]", "[[0.1, ...], ...]").
        if isinstance(value, str):
            try:
                return json.loads(value)
            except ValueError:
                raise ValueError("must be a JSON array") from None
        return value

    @field_validator("seconds", mode="before")
    @classmethod
    def _numeric_string(cls, value: Any) -> Any:
        # The OpenAI SDK sends seconds as a string ("4"), TensorRT-LLM's clients as a float
        # (4.0, or "4.0" in a form): whole numbers are taken, others stay a 400.
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value


class VideoError(BaseModel):
    message: str
    code: str | None = None


class VideoJob(BaseModel):
    """The job object (`VideoResponse`, spec §4.2)."""

    id: str
    object: str = "video"
    model: str
    status: str
    progress: int
    created_at: int
    size: str
    seconds: str
    quality: str = "standard"
    url: str | None = None
    urls: list[str] | None = None
    remixed_from_video_id: str | None = None
    prompt: str | None = None  # OpenAI's Video.prompt: the prompt the job ran (as revised)
    completed_at: int | None = None
    expires_at: int | None = None
    error: VideoError | None = None
    file_path: str | None = None
    file_paths: list[str] | None = None
    num_outputs: int = 1
    peak_memory_mb: float = 0.0
    inference_time_s: float | None = None
    stage_durations: dict[str, float] = {}
    # step caching of a completed job: {method, num_forwards, num_forwards_skipped}; None: off
    step_cache: dict[str, Any] | None = None
    revised_prompt: str | None = None
    action: dict[str, Any] | None = None
    # an action job's result again, where vLLM-Omni reads it: [{"url": ..., "action": ...}]
    data: list[dict[str, Any]] | None = None
    deleted: bool | None = None


class VideoList(BaseModel):
    object: str = "list"
    data: list[VideoJob]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False
