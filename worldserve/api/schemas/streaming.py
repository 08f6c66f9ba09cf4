"""Public schemas of the live video reasoning routes (spec streaming-reasoning.md sections 4-5).

The top-level create body ignores unknown keys because the contract says so (section 4.1);
`retention` and `sampling` refuse them. Retention and sampling arrive as plain objects and are
validated after the `model` check, which is the order of spec section 4.4.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from worldserve.ipc.messages import ReasonerRetention

_LIBRARY = ReasonerRetention()


class CreateSessionBody(BaseModel):
    """`POST /v1/streaming/sessions` (and the WebSocket create message without its extras)."""

    # Other top-level keys are ignored (spec section 4.1 [W]).
    model_config = ConfigDict(extra="ignore")

    system_prompt: str
    question: str = ""
    fps: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    model: str | None = None
    retention: dict[str, Any] | None = None
    sampling: dict[str, Any] | None = None

    @field_validator("system_prompt")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("system_prompt must not be empty; it is pinned for the whole session")
        return value


class WsCreateMessage(CreateSessionBody):
    """First WebSocket message: a create body plus `op` and `frame_format` (spec section 8.2)."""

    op: Literal["create"] = "create"
    frame_format: Literal["binary", "base64"] = "binary"


class RetentionIn(BaseModel):
    """A supplied retention object: library defaults plus the supplied fields, never merged
    with the server policy (spec section 4.2)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    max_video_segments: int = Field(default=_LIBRARY.max_video_segments, ge=1)
    max_text_tokens: int | None = Field(default=_LIBRARY.max_text_tokens, gt=0)
    max_session_tokens: int = Field(default=_LIBRARY.max_session_tokens, ge=1024)
    eviction_policy: Literal["sliding_window"] = "sliding_window"
    reprefill_threshold: float = Field(default=_LIBRARY.reprefill_threshold, gt=0, lt=1)


class SamplingIn(BaseModel):
    """Supplied sampling fields; each overrides the server default on its own (section 4.3)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    max_tokens: int = Field(default=24, ge=1)
    temperature: float = Field(default=0.3, ge=0)
    top_p: float = Field(default=0.9, gt=0, le=1)
    repetition_penalty: float = Field(default=1.1, gt=0)
    frequency_penalty: float = Field(default=0.0, ge=-2, le=2)
    presence_penalty: float = Field(default=0.0, ge=-2, le=2)
    top_k: int = Field(default=-1, ge=-1)
    seed: int | None = None
    stop: list[str] | None = Field(default=None, max_length=4)
    guided_json: dict[str, Any] | str | None = None
    guided_choice: list[str] | None = Field(default=None, min_length=1)
    guided_regex: str | None = None

    @field_validator("guided_choice")
    @classmethod
    def _choices_not_empty(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and any(not item for item in value):
            raise ValueError("guided_choice entries must be non-empty strings")
        return value

