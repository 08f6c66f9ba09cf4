"""Wire messages of vLLM-Omni's `WS /v1/realtime/video` (docs/realtime.md, "vLLM-Omni protocol").

Matched against vLLM-Omni's handler (`vllm_omni/entrypoints/openai/serving_video_output_stream.py`)
and its `VideoGenerationRequest` (`.../openai/protocol/videos.py`), both at commit 80a3d7fe. Every
message is a JSON text frame; each `video.chunk_metadata` is followed by one binary frame of
fragmented MP4. `session.start` carries `VideoGenerationRequest`'s fields: the ones a realtime
world model can honour are mapped (api/realtime/omni_mapping.py); the others are accepted only
at their default, so a value this server would ignore is refused, naming the field. Unknown
fields are refused too (vLLM-Omni ignores them; here a typo must not pass silently).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from worldserve.media.policy import MAX_PROMPT_CHARS

MAX_START_MESSAGE_BYTES = 4 * 1024 * 1024  # vLLM-Omni's limits
MAX_CONTROL_MESSAGE_BYTES = 128 * 1024
OUTPUT_FORMAT = "m4s"

SizeStr = Annotated[StrictStr, Field(pattern=r"^\d+x\d+$")]
SecondStr = Annotated[StrictStr, Field(pattern=r"^[1-9]\d*$")]

# VideoGenerationRequest fields a realtime world model cannot honour, with the default that is
# the only value accepted (anything else: an error naming the field).
UNSUPPORTED_AT_DEFAULT: dict[str, Any] = {
    "video_reference": None, "audio_reference": None, "aspect_ratio": None, "short_edge": None,
    "num_outputs_per_prompt": 1, "start_time_seconds": None, "quality": "lossless",
    "guidance_scale_2": None, "boundary_ratio": None, "flow_shift": None,
    "true_cfg_scale": None, "generate_sound": False, "sound_duration": None,
    "enable_frame_interpolation": False, "frame_interpolation_exp": 1,
    "frame_interpolation_scale": 1.0, "frame_interpolation_model_path": None, "lora": None,
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class VideoParams(_Strict):
    width: int | None = Field(default=None, ge=1)
    height: int | None = Field(default=None, ge=1)
    num_frames: int | None = Field(default=None, ge=1)
    fps: int | None = Field(default=None, ge=1)


class SessionStart(_Strict):
    """`session.start`: `type`, `format` and vLLM-Omni's `VideoGenerationRequest` fields."""

    type: Literal["session.start"]
    format: Literal["m4s"] = "m4s"
    model: StrictStr | None = None
    prompt: Annotated[StrictStr, Field(min_length=1, max_length=MAX_PROMPT_CHARS)]
    seconds: SecondStr | None = None
    size: SizeStr | None = None
    image_reference: dict[str, Any] | list[Any] | None = None
    video_params: VideoParams | None = None
    user: StrictStr | None = None
    width: int | None = Field(default=None, ge=1)
    height: int | None = Field(default=None, ge=1)
    fps: int | None = Field(default=None, ge=1)
    num_frames: int | None = Field(default=None, ge=1)
    negative_prompt: StrictStr | None = None
    num_inference_steps: int | None = Field(default=None, ge=1, le=200)
    guidance_scale: float | None = Field(default=None, ge=0.0, le=20.0)
    seed: int | None = None
    extra_params: dict[str, Any] | None = None
    # Accepted only at their default (UNSUPPORTED_AT_DEFAULT).
    video_reference: Any = None
    audio_reference: Any = None
    aspect_ratio: Any = None
    short_edge: Any = None
    num_outputs_per_prompt: Any = 1
    start_time_seconds: Any = None
    quality: Any = "lossless"
    guidance_scale_2: Any = None
    boundary_ratio: Any = None
    flow_shift: Any = None
    true_cfg_scale: Any = None
    generate_sound: Any = False
    sound_duration: Any = None
    enable_frame_interpolation: Any = False
    frame_interpolation_exp: Any = 1
    frame_interpolation_scale: Any = 1.0
    frame_interpolation_model_path: Any = None
    lora: Any = None


class InvalidMessage(ValueError):
    """A client message that fails validation: `param` names the field (when one is at fault),
    `code` is the error's `code` (vLLM-Omni's where it has one)."""

    def __init__(self, message: str, param: str | None = None,
                 code: str = "invalid_request") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


def merge_sampling_params(message: dict[str, Any]) -> dict[str, Any]:
    """vLLM-Omni's `sampling_params` folding: a key of the request model not given at the top
    level moves there; any other key joins `extra_params`."""
    data = {k: v for k, v in message.items() if k != "sampling_params"}
    sampling = message.get("sampling_params")
    if sampling is None:
        return data
    if not isinstance(sampling, dict):
        raise InvalidMessage("Invalid session.start: sampling_params must be a JSON object",
                             "sampling_params")
    extra = dict(data.get("extra_params") or {})
    for key, value in sampling.items():
        if key in SessionStart.model_fields and key not in data and key != "type":
            data[key] = value
        else:
            extra[key] = value
    if extra:
        data["extra_params"] = extra
    return data


def parse_session_start(message: Any) -> SessionStart:
    """The validated `session.start`; InvalidMessage naming the first field at fault."""
    if not isinstance(message, dict):
        raise InvalidMessage("session.start must be a JSON object")
    if message.get("type") != "session.start":
        raise InvalidMessage(f"Expected session.start, got: {message.get('type')}", "type")
    if message.get("format", OUTPUT_FORMAT) != OUTPUT_FORMAT:
        raise InvalidMessage("Invalid session.start format: expected 'm4s'.", "format")
    try:
        start = SessionStart.model_validate(merge_sampling_params(message))
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ()))
        text = "unknown field; remove it" if err["type"] == "extra_forbidden" else err["msg"]
        raise InvalidMessage(f"Invalid session.start: {loc}: {text}", loc or None) from None
    for name, default in UNSUPPORTED_AT_DEFAULT.items():
        if getattr(start, name) != default:
            raise InvalidMessage(f"Invalid session.start: {name} is not supported by this "
                                 f"realtime model; omit it (or send {default!r})", name)
    return start


# ------------------------------------------------------------------ server -> client


def video_start(request_id: str, config: dict[str, Any]) -> dict[str, Any]:
    return {"type": "video.start", "request_id": request_id, "format": OUTPUT_FORMAT,
            "config": config}


def chunk_metadata(request_id: str, *, transport_chunk_index: int, generation_chunk_index: int,
                   num_frames: int, byte_length: int, started: list[str], active: list[str],
                   completed: list[str]) -> dict[str, Any]:
    return {"type": "video.chunk_metadata", "request_id": request_id, "kind": "media",
            "num_frames": num_frames, "byte_length": byte_length,
            "generation_chunk_index": generation_chunk_index,
            "started_event_ids": started, "active_event_ids": active,
            "completed_event_ids": completed, "transport_chunk_index": transport_chunk_index}


def session_done(request_id: str, chunks: int, stopped: bool) -> dict[str, Any]:
    return {"type": "session.done", "request_id": request_id, "chunks": chunks,
            "stopped": stopped}


def interaction_queued(request_id: str, event_id: str) -> dict[str, Any]:
    return {"type": "session.interaction.queued", "request_id": request_id, "event_id": event_id}


def error(message: str, code: str | None = None, *, param: str | None = None,
          request_id: str | None = None, event_id: str | None = None,
          **extra: Any) -> dict[str, Any]:
    """vLLM-Omni's error shape (`type`, `message`, optional `code`, `request_id`, `event_id`);
    `param` (the field at fault) is this server's addition."""
    body: dict[str, Any] = {"type": "error", "message": message}
    optional = {"code": code, "param": param, "request_id": request_id, "event_id": event_id}
    body.update({k: v for k, v in optional.items() if v is not None})
    body.update(extra)
    return body
