"""The static rules of a generation request, read from the model's declaration.

One source for each rule: the api checks a request here against the stage's declared
`GenerationCapabilities` before relaying it (a 400 in milliseconds, however busy the stage), and
the stage calls the same function as a backstop when it accepts the request. Only what the
declaration fixes is checked here (shapes, frame counts, domains, widths, tiers, image xor
video); what needs the weights (the pipeline's own `check_inputs`) stays in the stage.

`horizon_field` names the request field an action run's horizon came from, so a message blames
what the client sent: `action_horizon` (actions routes), `num_frames` or the rows of `action`
(forward dynamics on `/v1/videos`).
"""

from __future__ import annotations

from typing import Literal

from worldserve.errors import InvalidRequest
from worldserve.ipc.capabilities import (
    ActionGenerationCapabilities,
    GenerationCapabilities,
    GenerationDefaults,
)
from worldserve.ipc.messages import ActionCondition, GenerationParams

ACTION_MODES = ("policy", "forward_dynamics", "inverse_dynamics")
VIDEO_KEEP = ("first", "last")
HorizonField = Literal["action_horizon", "num_frames", "action"]


def check_generation(params: GenerationParams, caps: GenerationCapabilities,
                     horizon_field: HorizonField = "action_horizon") -> None:
    """400 naming the field for anything `caps` says the model cannot run."""
    if params.generate_sound and not caps.sound:
        raise InvalidRequest("this model does not generate sound (its checkpoint has no sound "
                             "tokenizer)", param="generate_sound")
    if params.condition_images and params.condition_video is not None:
        raise InvalidRequest("give either an image (input_reference) or a video (video_path, "
                             "video_url or video_reference), not both", param="input_reference")
    if params.step_cache and caps.step_cache is None:
        why = ("it is turned off on this server (stages.generation.step_cache.enabled)"
               if caps.step_cache_methods else
               "this model does not support it (its family declares no cache method)")
        raise InvalidRequest(f"enable_teacache: step caching is not available: {why}",
                             param="enable_teacache")
    if not params.seeds:
        raise InvalidRequest("at least one output is required", param="n")
    if params.num_inference_steps <= 0:
        raise InvalidRequest("num_inference_steps must be positive", param="num_inference_steps")
    if params.action is not None:
        _check_action(params, params.action, caps, horizon_field)
    else:
        _check_media(params, caps)


def _check_media(params: GenerationParams, caps: GenerationCapabilities) -> None:
    m, stride = caps.size_multiple, caps.temporal_stride
    for name in ("width", "height"):
        value = getattr(params, name)
        if value <= 0 or value % m:
            raise InvalidRequest(f"{name} must be a positive multiple of {m} for this model "
                                 f"(got {value})", param=name)
    if caps.exact_num_frames and (params.num_frames < 1 or params.num_frames % stride != 1):
        raise InvalidRequest(f"num_frames must be {stride}k+1 (1, 5, 9, ...) for this model: the "
                             f"VAE's temporal stride is {stride} (got {params.num_frames})",
                             param="num_frames")
    _check_limits(params, caps.defaults)
    if params.condition_video is not None:
        _check_video_condition(params, stride)


def _check_limits(params: GenerationParams, limits: GenerationDefaults) -> None:
    """The checkpoint's declared size limits (its family's template): a request past one is a
    400 naming the field and every limit, instead of a job that would run for hours."""
    pixels = params.width * params.height
    for name, value, limit in (
        ("width", params.width, limits.max_width),
        ("height", params.height, limits.max_height),
        ("size", pixels, limits.max_pixels),
        ("num_frames", params.num_frames, limits.max_num_frames),
        ("num_frames", pixels * params.num_frames, limits.max_video_pixels),
    ):
        if limit is not None and value > limit:
            raise InvalidRequest(
                f"{name}: {params.width}x{params.height} x {params.num_frames} frame(s) is past "
                f"this model's limits ({limits_text(limits)}); ask for a smaller size or fewer "
                "frames", param=name)


def limits_text(limits: GenerationDefaults) -> str:
    """The declared limits in words, e.g. `width <= 1280, height <= 1280, ...`."""
    named = (("width", limits.max_width), ("height", limits.max_height),
             ("width x height", limits.max_pixels), ("num_frames", limits.max_num_frames),
             ("width x height x num_frames", limits.max_video_pixels))
    return ", ".join(f"{name} <= {limit}" for name, limit in named if limit is not None)


def _check_video_condition(params: GenerationParams, stride: int) -> None:
    if params.num_frames == 1:
        raise InvalidRequest("video conditioning requires num_frames > 1", param="num_frames")
    if (params.condition_video_keep or "first") not in VIDEO_KEEP:
        raise InvalidRequest("condition_video_keep must be 'first' or 'last' (got "
                             f"{params.condition_video_keep!r})", param="condition_video_keep")
    indexes = params.condition_frame_indexes_vision
    if indexes is None:
        return
    latent_frames = (params.num_frames - 1) // stride + 1
    if not indexes or any(i < 0 for i in indexes):
        raise InvalidRequest("condition_frame_indexes_vision must be a non-empty list of "
                             "non-negative latent frame indexes, e.g. [0, 1]",
                             param="condition_frame_indexes_vision")
    if max(indexes) >= latent_frames:
        raise InvalidRequest(
            f"condition_frame_indexes_vision {indexes} contains an index outside the latent "
            f"timeline (latent_frames={latent_frames} for num_frames={params.num_frames})",
            param="condition_frame_indexes_vision")


def _check_action(params: GenerationParams, action: ActionCondition,
                  caps: GenerationCapabilities, horizon_field: HorizonField) -> None:
    actions = caps.action_generation
    if actions is None:
        raise InvalidRequest("this model does not generate actions (it has no action heads)",
                             param="action_mode")
    if action.mode not in ACTION_MODES:
        raise InvalidRequest(f"unsupported action_mode {action.mode!r}; expected one of "
                             f"{', '.join(ACTION_MODES)}", param="action_mode")
    _check_horizon(action.chunk_size, caps.temporal_stride, horizon_field)
    width = _domain_width(action.domain_name, actions)
    if action.resolution_tier not in actions.resolution_tiers:
        raise InvalidRequest(f"Unsupported action resolution_tier={action.resolution_tier!r}; "
                             f"expected one of {sorted(actions.resolution_tiers)}",
                             param="resolution_tier")
    _check_observation(params, action)
    if action.mode == "forward_dynamics":
        _check_raw_actions(action, width)


def _check_horizon(horizon: int, stride: int, field: HorizonField) -> None:
    if horizon >= 1 and horizon % stride == 0:
        return
    if field == "num_frames":
        message = (f"num_frames must be {stride}k+1 (5, 9, ...) for forward dynamics: the clip "
                   f"rolls out num_frames - 1 action rows (got {horizon + 1})")
    elif field == "action":
        message = (f"action has {horizon} rows; forward dynamics takes a positive multiple of "
                   f"{stride} rows (the clip has one frame more than rows, and "
                   f"{stride}k+1 frames)")
    else:
        message = (f"action_horizon must be a positive multiple of {stride}: the clip has "
                   f"action_horizon + 1 frames, which must be {stride}k+1 (got {horizon})")
    raise InvalidRequest(message, param=field)


def _domain_width(name: str, actions: ActionGenerationCapabilities) -> int:
    width = actions.domains.get(name)
    if width is None:
        raise InvalidRequest(f"Unknown action domain_name={name!r} for this model; expected one "
                             f"of {sorted(actions.domains)}", param="domain_name")
    return width


def _check_observation(params: GenerationParams, action: ActionCondition) -> None:
    has_image, has_video = bool(params.condition_images), params.condition_video is not None
    if not (has_image or has_video):
        raise InvalidRequest(f"action_mode {action.mode!r} needs an observation: an image or a "
                             "video", param="image")
    if action.mode == "inverse_dynamics" and not has_video:
        raise InvalidRequest("action_mode 'inverse_dynamics' requires a video observation",
                             param="video")


def _check_raw_actions(action: ActionCondition, width: int) -> None:
    rows = action.raw_actions
    if not rows:
        raise InvalidRequest("action_mode 'forward_dynamics' requires `action`: raw action rows "
                             f"[T][{width}]", param="action")
    bad = next((i for i, row in enumerate(rows) if len(row) != width), None)
    if bad is not None:
        raise InvalidRequest(f"`action` row {bad}: width ({len(rows[bad])}) does not match the "
                             f"expected action width ({width}) for "
                             f"domain_name={action.domain_name!r}", param="action")
