"""Cosmos3 request fields on the native media routes (spec native-media.md §4.1, §5.2.2).

Wire parsing only: fields become `GenerationParams` (and an `ActionCondition`); every rule that
depends on the checkpoint (sound on Edge, domains, widths, frame counts, image xor video) is
checked once by the generation stage when it accepts the request (-> 400).
"""

from __future__ import annotations

from typing import Any

from worldserve.api.schemas.videos import VideoCreateRequest
from worldserve.errors import InvalidRequest
from worldserve.ipc.capabilities import GenerationCapabilities
from worldserve.ipc.messages import ActionCondition, GenerationParams

COSMOS3_VIDEO_FIELDS = (
    "generate_sound", "sound_duration", "condition_frame_indexes",
    "condition_frame_indexes_vision", "condition_video_keep", "action_mode", "domain_id",
    "domain_name", "raw_action_dim", "action_fps", "action", "action_view_point",
    "action_normalization", "resolution_tier")
DEFAULT_RESOLUTION_TIER = 480
DEFAULT_VIEW_POINT = "ego_view"


def refuse_for_other_models(body: VideoCreateRequest, caps: GenerationCapabilities) -> None:
    """Cosmos3 fields on a model that does not declare them -> 400 naming the field."""
    if caps.family == "cosmos3":
        return
    for name in COSMOS3_VIDEO_FIELDS:
        if getattr(body, name) not in (None, False):
            raise InvalidRequest(f"{name} is a Cosmos3 field; this model "
                                 f"({caps.pipeline}) does not support it", param=name)


def snap_default_frames(num_frames: int, caps: GenerationCapabilities) -> int:
    """An omitted num_frames (fps x seconds) becomes the nearest count the VAE takes."""
    stride = max(1, caps.temporal_stride)
    return max(1, (num_frames - 1) // stride * stride + 1)


def apply_video_fields(params: GenerationParams, body: VideoCreateRequest,
                       caps: GenerationCapabilities, fps: int) -> None:
    """Copy the Cosmos3 fields of `POST /v1/videos` into the stage parameters."""
    if caps.family != "cosmos3":
        return
    params.fps = float(fps)
    if body.num_frames is None and caps.exact_num_frames:
        params.num_frames = snap_default_frames(params.num_frames, caps)
    params.generate_sound = bool(body.generate_sound)
    indexes = body.condition_frame_indexes_vision or body.condition_frame_indexes
    params.condition_frame_indexes_vision = list(indexes) if indexes is not None else None
    params.condition_video_keep = body.condition_video_keep
    if body.action_mode is None:
        if body.action is not None:
            raise InvalidRequest("action needs action_mode 'forward_dynamics'", param="action")
        return
    if body.action_mode != "forward_dynamics":
        raise InvalidRequest(f"action_mode {body.action_mode!r} predicts actions: use "
                             "POST /v1/actions/generations (/v1/videos takes "
                             "'forward_dynamics')", param="action_mode")
    rows = body.action or []
    horizon = (body.num_frames - 1) if body.num_frames is not None else len(rows)
    params.num_frames = horizon + 1  # the clip an action run produces
    params.action = ActionCondition(
        mode="forward_dynamics", chunk_size=horizon,
        domain_name=domain_name(body.domain_name, body.domain_id, body.raw_action_dim, caps),
        resolution_tier=body.resolution_tier or DEFAULT_RESOLUTION_TIER,
        view_point=body.action_view_point or DEFAULT_VIEW_POINT, raw_actions=rows or None)


def domain_name(name: str | None, domain_id: int | None, raw_action_dim: int | None,
                caps: GenerationCapabilities) -> str:
    """`domain_name`, or the domain that `domain_id` and `raw_action_dim` name together."""
    if name:
        return name
    if domain_id is None or raw_action_dim is None:
        raise InvalidRequest("give domain_name (e.g. 'av'), or domain_id and raw_action_dim "
                             "together", param="domain_name")
    actions = caps.action_generation
    for candidate, ident in (actions.domain_ids if actions else {}).items():
        if ident == domain_id and actions and actions.domains.get(candidate) == raw_action_dim:
            return candidate
    raise InvalidRequest(f"no embodiment domain has domain_id {domain_id} with "
                         f"raw_action_dim {raw_action_dim}", param="domain_id")


def job_action(action: ActionCondition | None,
               caps: GenerationCapabilities) -> dict[str, Any] | None:
    """The job object's `action` (spec §4.2): the rows a forward-dynamics job rolls out."""
    if action is None:
        return None
    rows = action.raw_actions or []
    actions = caps.action_generation
    return {"data": rows, "shape": [len(rows), len(rows[0]) if rows else 0],
            "dtype": "float32",
            "raw_action_dim": actions.domains.get(action.domain_name) if actions else None,
            "action_mode": action.mode,
            "domain_id": actions.domain_ids.get(action.domain_name) if actions else None}
