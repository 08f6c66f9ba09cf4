"""The realtime stage: world exploration over a WebSocket with a causal video model."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from worldserve.config.loading import StageConfig


class RealtimeStageConfig(StageConfig):
    """Realtime world exploration (causal video model), a stage of its own."""

    LIFTED_OVERRIDES: ClassVar[dict[str, str]] = {
        "warmup_mode": "warmup_mode", "warmup_resolutions": "warmup_sizes"}
    # The fake backend's test knobs (engines/realtime/fake.py).
    ACCEPTED_OVERRIDES: ClassVar[frozenset[str]] = frozenset({
        "host", "frames_per_chunk", "min_pulse_items", "fake_forward_ms", "fake_camera",
        "fake_realtime_supported", "fake_lose_session_seed"})

    # `causal`: the causal video diffusion model; `fake`: synthetic frames for protocol tests.
    backend: Literal["causal", "fake"] = "causal"
    max_sessions: int = Field(default=2, ge=1, le=64)
    admission_wait_s: float = Field(default=10.0, ge=0)
    max_sessions_per_user: int = Field(default=0, ge=0)
    idle_timeout_s: float = Field(default=300.0, gt=0)
    max_lifetime_s: float = Field(default=0.0, ge=0)
    # Api side of the WebSocket: how long a socket may go without a valid init, and how long
    # one chunk may take in the stage before the session fails.
    init_timeout_s: float = Field(default=60.0, gt=0)
    chunk_timeout_s: float = Field(default=300.0, gt=0)
    # 0 = off. Else a session is admitted only while the estimated KV bytes of all sessions
    # (engine `kv_bytes_per_token` x window x tokens per frame) stay within this budget.
    kv_budget_gib: float = Field(default=0.0, ge=0)
    # Model (engine) settings. None: the checkpoint's default (realtime_config.json). Frame
    # counts are latent frames; sessions may override sink/window within the bounds of
    # spec realtime-video.md section 6.3.
    sink_frames: int | None = Field(default=None, ge=0)
    window_frames: int | None = Field(default=None, ge=1)
    frames_per_block: int | None = Field(default=None, ge=1, le=16)
    num_inference_steps: int | None = Field(default=None, ge=1, le=50)
    max_inference_steps: int = Field(default=16, ge=1, le=100)
    max_width: int = Field(default=1280, ge=16)
    max_height: int = Field(default=1280, ge=16)
    # Session table bound = max_sessions + this margin (LRU safety net for lost releases).
    session_table_margin: int = Field(default=2, ge=0, le=64)
    # With warmup_mode "server": "WxH" sizes of the synthetic warm-up sessions (spec section 9);
    # None: the checkpoint's default size.
    warmup_sizes: list[str] | None = None

    @model_validator(mode="after")
    def _fake_knobs_need_the_fake_backend(self) -> "RealtimeStageConfig":
        knobs = sorted(set(self.server_args_overrides) - {"host"})
        if knobs and self.backend != "fake":
            raise ValueError(f"server_args_overrides.{knobs[0]}: only the fake backend reads "
                             f"it (backend is {self.backend!r})")
        return self

    @field_validator("warmup_sizes")
    @classmethod
    def _sizes_are_wxh(cls, sizes: list[str] | None) -> list[str] | None:
        for size in sizes or []:
            parts = size.split("x")
            if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
                raise ValueError(f"warm-up size {size!r} is not WxH (e.g. 832x480)")
        return sizes


