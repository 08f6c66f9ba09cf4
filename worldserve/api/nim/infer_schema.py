"""`POST /v1/infer` request schema: the Generator NIM's contract (cookbook api-reference.md,
generation.md, action.md). Strict JSON types (`"35"`, `35.0` and `true` are not the integer 35),
unknown fields refused, and the NIM's own messages for its deprecated and vLLM-Omni-only fields.
Per-mode rules that span fields are `infer_rules.py`'s."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from worldserve.errors import InvalidRequest

MAX_PROMPT_CHARS = 20_000
MAX_IMAGE_REFERENCE_CHARS = 20_000_000
MAX_TRANSFER_REFERENCE_CHARS = 100_000_000
MAX_SEED = 2**63 - 11  # signed 64-bit seeds (the native routes' bound)
MODES = ("text2image", "text2video", "image2video", "video2video", "forward_dynamics", "policy",
         "inverse_dynamics")
ACTION_MODES = ("forward_dynamics", "policy", "inverse_dynamics")
ModelMode = Literal["text2image", "text2video", "image2video", "video2video",
                    "forward_dynamics", "policy", "inverse_dynamics"]
# The NIM answers these with 422 and a migration hint (api-reference.md, generation.md).
DEPRECATED = {"image": "input_reference", "video": "input_reference",
              "num_output_frames": "num_frames", "steps": "num_inference_steps"}
VLLM_OMNI_ONLY = ("extra_params", "control_path", "view_point", "guardrails", "max_frames")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class ActionParams(_Strict):
    """`action_params` (action.md "Action parameter reference")."""

    domain_name: Literal["av", "umi", "bridge_orig_lerobot", "droid_lerobot"]
    action_chunk_size: int = Field(ge=1, le=1024)
    action: list[list[float]] | None = None
    raw_action_dim: int | None = Field(default=None, ge=1)
    action_space: Literal["joint_pos", "midtrain"] = "joint_pos"
    image_size: Literal["256", "480", "704", "720"] = "480"
    action_fps: float | None = Field(default=None, ge=1.0, le=60.0)
    history_length: int | None = Field(default=None, ge=1)
    use_state: bool | None = None
    observation: dict[str, Any] | None = None


class InferRequest(_Strict):
    """The request envelope (api-reference.md "Common Generator request fields")."""

    model_mode: ModelMode
    prompt: str | None = Field(default=None, max_length=MAX_PROMPT_CHARS)
    negative_prompt: str | None = Field(default=None, max_length=MAX_PROMPT_CHARS)
    input_reference: str | None = Field(default=None, max_length=MAX_TRANSFER_REFERENCE_CHARS)
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    guidance_scale: float | None = Field(default=None, ge=1.0, le=7.0)
    num_inference_steps: int | None = Field(default=None, ge=1, le=100)
    flow_shift: float | None = Field(default=None, gt=0)
    resolution: str | None = None
    num_frames: int | None = None
    fps: float | None = Field(default=None, ge=1.0, le=60.0)
    condition_frame_indexes_vision: list[int] | None = None
    condition_video_keep: Literal["first", "last"] | None = None
    action_params: ActionParams | None = None
    transfer: dict[str, Any] | None = None


def parse_infer(payload: Any) -> InferRequest:
    """The validated envelope; 400 (-> the route's 422) naming the field and the rule."""
    if not isinstance(payload, dict):
        raise InvalidRequest("the /v1/infer body must be a JSON object")
    _refuse_retired(payload)
    try:
        return InferRequest.model_validate(payload)
    except ValidationError as exc:
        raise InvalidRequest(_first_error(exc), param=_first_loc(exc)) from None


def _refuse_retired(payload: dict[str, Any]) -> None:
    for name, current in DEPRECATED.items():
        if name in payload:
            raise InvalidRequest(f"{name} is a retired /v1/infer field; use {current}",
                                 param=name)
    action = payload.get("action_params")
    if isinstance(action, dict) and "mode" in action:
        raise InvalidRequest("action_params.mode is a retired field; use the top-level "
                             "model_mode", param="action_params.mode")
    for name in payload:
        if name in VLLM_OMNI_ONLY or name.startswith("show_"):
            raise InvalidRequest(f"{name} is a vLLM-Omni field, not a /v1/infer field; "
                                 "translate the request (unknown fields are rejected)",
                                 param=name)


def _first_loc(exc: ValidationError) -> str:
    return ".".join(str(p) for p in exc.errors()[0]["loc"])


def _first_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = _first_loc(exc) or "body"
    if first["type"] == "extra_forbidden":
        return f"{where}: unknown field (the Generator NIM rejects unknown fields)"
    return f"{where}: {first['msg']}"
