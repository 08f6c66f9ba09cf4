"""Public schema of the realtime WebSocket (spec realtime-video §3): `init` and `event`.

Per the contract, unknown keys of `init` and `event` are accepted and ignored (SGLang clients
send adapter-specific extras); that is why these models use extra="ignore". Fields that would
let a client choose server paths (`output_path`, `perf_dump_path`, `*_model_path`) make the
init invalid instead. Engine-dependent rules (sizes, window >= sink + block, camera support)
are checked by the realtime service against the engine's capabilities.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    field_validator,
    model_validator,
)

from worldserve.media.framing import DELTA_LEVEL_RANGE
from worldserve.media.policy import MAX_PROMPT_CHARS

CameraKey = Literal["w", "a", "s", "d", "i", "j", "k", "l"]
CAMERA_KEYS = frozenset("wasdijkl")
MAX_TRANSITIONS_PER_EVENT = 512
MAX_DSL_ITEMS = 1024
FORBIDDEN_INIT_KEYS = ("output_path", "perf_dump_path", "model_path")
SIZE_RE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")
DSL_ITEM_RE = re.compile(r"^(none|[wasdijkl]+)-(\d+)$")
NonEmptyStr = Annotated[StrictStr, Field(min_length=1, max_length=MAX_PROMPT_CHARS)]


class _Lenient(BaseModel):
    # Unknown keys are accepted and ignored: required by the contract (§3.1, §3.2).
    model_config = ConfigDict(extra="ignore", frozen=True)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ConditionInputs(_Lenient):
    """`camera_actions` (script) or `action` (DSL), plus optional camera intrinsics."""

    camera_actions: list[list[CameraKey]] | None = None
    action: StrictStr | None = None
    intrinsics: list[Any] | None = None
    intrinsics_path: StrictStr | None = None

    @model_validator(mode="after")
    def _one_camera_source(self) -> "ConditionInputs":
        if self.camera_actions is not None and self.action is not None:
            raise ValueError("condition_inputs: give camera_actions or action, not both")
        if self.intrinsics_path is not None:
            raise ValueError(
                "condition_inputs.intrinsics_path: server paths are refused; "
                "send intrinsics as an array"
            )
        if self.action is not None:
            parse_action_dsl(self.action, max_frames=None)
        return self


class InitRequest(_Lenient):
    """The `init` map (§3.1)."""

    type: Literal["init"]
    prompt: NonEmptyStr
    first_frame: bytes | StrictStr | None = None
    condition_inputs: ConditionInputs | None = None
    max_chunks: int | None = Field(default=None, ge=1)
    seed: int = 42
    guidance_scale: float = Field(default=1.0, ge=0, le=100)
    size: StrictStr | None = None
    fps: int | None = Field(default=None, gt=0, le=240)
    num_frames: int | None = Field(default=None, ge=1)
    num_inference_steps: int | None = Field(default=None, gt=0, le=100)
    negative_prompt: StrictStr | None = None
    realtime_output_format: Literal["raw", "webp", "jpeg", "delta-gzip", "delta-zstd"] | None = None
    realtime_preview_max_width: int | None = Field(default=None, ge=16, le=8192)
    output_compression: int | None = Field(default=None, ge=0, le=100)
    realtime_delta_level: int | None = None
    realtime_output_pacing: StrictBool = False
    realtime_causal_sink_size: int | None = Field(default=None, ge=0)
    realtime_causal_kv_cache_num_frames: int | None = Field(default=None, gt=0)
    realtime_prompt_refresh_kv: StrictBool = False
    enable_upscaling: StrictBool = False
    upscaling_scale: float | None = None
    enable_frame_interpolation: StrictBool = False
    frame_interpolation_exp: int | None = None
    frame_interpolation_scale: float | None = None
    profile: bool = False
    num_profiled_timesteps: int | None = None
    profile_all_stages: bool = False
    model: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_server_paths(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in data:
                if isinstance(key, str) and (
                    key in FORBIDDEN_INIT_KEYS or key.endswith("_model_path")
                ):
                    raise ValueError(f"{key}: clients cannot choose server paths; remove the field")
        return data

    @field_validator("size")
    @classmethod
    def _size_format(cls, size: str | None) -> str | None:
        if size is not None:
            parse_size(size)
        return size

    @model_validator(mode="after")
    def _cross_checks(self) -> "InitRequest":
        fmt = self.realtime_output_format or "raw"
        if self.realtime_delta_level is not None:
            if fmt not in DELTA_LEVEL_RANGE:
                raise ValueError(
                    "realtime_delta_level applies to delta-gzip/delta-zstd output only"
                )
            low, high = DELTA_LEVEL_RANGE[fmt]
            if not low <= self.realtime_delta_level <= high:
                raise ValueError(
                    f"realtime_delta_level: {self.realtime_delta_level} is outside "
                    f"{low}..{high} for {fmt}"
                )
        if self.enable_upscaling or self.enable_frame_interpolation:
            raise ValueError(
                "enable_upscaling / enable_frame_interpolation are not supported "
                "by this server's realtime pipeline"
            )
        return self

    @property
    def output_format(self) -> str:
        return self.realtime_output_format or "raw"


def parse_size(size: str) -> tuple[int, int]:
    """`"WxH"` -> (width, height), both positive."""
    match = SIZE_RE.match(size)
    if not match or int(match.group(1)) <= 0 or int(match.group(2)) <= 0:
        raise ValueError(f"size: {size!r} is not 'WxH' with positive integers (e.g. '832x480')")
    return int(match.group(1)), int(match.group(2))


def parse_action_dsl(text: str, max_frames: int | None) -> list[list[str]]:
    """`"w-20,wd-10,none-5"` -> one key list per output frame (§3.5)."""
    frames: list[list[str]] = []
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or len(items) > MAX_DSL_ITEMS:
        raise ValueError(
            f"action: expected 1..{MAX_DSL_ITEMS} comma-separated '<keys>-<frames>' "
            f"items, got {text[:80]!r}"
        )
    for item in items:
        match = DSL_ITEM_RE.match(item)
        if not match or int(match.group(2)) <= 0:
            raise ValueError(
                f"action: item {item!r} is not '<keys>-<frames>' with keys from "
                "wasdijkl (or 'none') and a positive frame count, e.g. 'w-20'"
            )
        keys = [] if match.group(1) == "none" else sorted(set(match.group(1)), key="wasdijkl".index)
        count = int(match.group(2))
        if max_frames is not None and len(frames) + count > max_frames:
            raise ValueError(f"action: the script has more than {max_frames} frames")
        frames.extend([list(keys) for _ in range(count)])
    return frames


class EventMessage(_Lenient):
    """The `event` envelope (§3.2); the payload is validated per kind."""

    type: Literal["event"]
    kind: StrictStr
    payload: Any = None
    event_id: int | None = None
    client_sent_perf_ms: float | None = None
    client_sent_epoch_ms: float | None = None


class Transition(_Lenient):
    actions: list[CameraKey]
    client_ts_ms: float | None = None


class StatePayload(_Lenient):
    mode: Literal["state"]
    transitions: list[Transition] = Field(max_length=MAX_TRANSITIONS_PER_EVENT)


class PromptPayload(_Strict):
    prompt: NonEmptyStr
    refresh_kv: StrictBool | None = None


class CompositePayload(_Lenient):
    input_types: list[Literal["camera_actions", "prompt"]] = Field(min_length=1, max_length=2)
    camera_actions: Any = None
    prompt: Any = None

    @model_validator(mode="after")
    def _parts_present(self) -> "CompositePayload":
        if len(set(self.input_types)) != len(self.input_types):
            raise ValueError("composite_input: input_types lists a part twice")
        for part in self.input_types:
            if getattr(self, part) is None:
                raise ValueError(f"composite_input: input_types names {part!r} but it is missing")
        return self
