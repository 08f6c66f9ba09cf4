"""The Cosmos3 request rules (shared/spec/native-media.md §4.1 Cosmos3 fields, §5.2.2), checked
once when the stage accepts a request. Messages follow `Cosmos3OmniPipeline.check_inputs` and
`CosmosActionCondition` where those have one; the tables are the pipeline's own."""

from __future__ import annotations

from typing import Any

from worldserve.errors import InvalidRequest
from worldserve.ipc.messages import ActionCondition, GenerationParams

ACTION_MODES = ("policy", "forward_dynamics", "inverse_dynamics")
VIDEO_KEEP = ("first", "last")


def check_request(params: GenerationParams, runner: Any) -> None:
    if params.generate_sound and not runner.supports_sound:
        raise InvalidRequest("Cosmos3 Edge does not support sound generation (this checkpoint "
                             "has no sound tokenizer)", param="generate_sound")
    if params.condition_images and params.condition_video is not None:
        raise InvalidRequest("give either an image (input_reference) or a video (video_path, "
                             "video_url or video_reference), not both", param="input_reference")
    if not params.seeds:
        raise InvalidRequest("at least one output is required", param="n")
    if params.num_inference_steps <= 0:
        raise InvalidRequest("num_inference_steps must be positive", param="num_inference_steps")
    if params.action is not None:
        _check_action(params, params.action, runner)
    else:
        _check_media(params, runner)


def _check_media(params: GenerationParams, runner: Any) -> None:
    m, stride = runner.size_multiple, runner.temporal_stride
    for name in ("width", "height"):
        value = getattr(params, name)
        if value <= 0 or value % m:
            raise InvalidRequest(f"{name} must be a positive multiple of {m} for Cosmos3 "
                                 f"(got {value})", param=name)
    if params.num_frames < 1 or params.num_frames % stride != 1:
        raise InvalidRequest(f"num_frames must be {stride}k+1 (1, 5, 9, ...) for Cosmos3: the "
                             f"VAE's temporal stride is {stride} (got {params.num_frames})",
                             param="num_frames")
    if params.condition_video is None:
        return
    if params.num_frames == 1:
        raise InvalidRequest("video conditioning requires num_frames > 1", param="num_frames")
    if (params.condition_video_keep or "first") not in VIDEO_KEEP:
        raise InvalidRequest("condition_video_keep must be 'first' or 'last' (got "
                             f"{params.condition_video_keep!r})", param="condition_video_keep")
    indexes = params.condition_frame_indexes_vision
    if indexes is not None:
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


def _check_action(params: GenerationParams, action: ActionCondition, runner: Any) -> None:
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import (
        _ACTION_RESOLUTION_BINS,
        _EMBODIMENT_TO_DOMAIN_ID,
        _EMBODIMENT_TO_RAW_ACTION_DIM,
    )

    if not runner.supports_actions:
        raise InvalidRequest("this Cosmos3 checkpoint has no action heads (action_gen is false)",
                             param="action_mode")
    if action.mode not in ACTION_MODES:
        raise InvalidRequest(f"unsupported action_mode {action.mode!r}; expected one of "
                             f"{', '.join(ACTION_MODES)}", param="action_mode")
    if action.chunk_size < 1 or action.chunk_size % runner.temporal_stride:
        raise InvalidRequest(
            f"action_horizon must be a positive multiple of {runner.temporal_stride}: the clip "
            f"has action_horizon + 1 frames, which must be {runner.temporal_stride}k+1 (got "
            f"{action.chunk_size})", param="action_horizon")
    if action.domain_name not in _EMBODIMENT_TO_DOMAIN_ID:
        raise InvalidRequest(f"Unknown Cosmos3 action domain_name={action.domain_name!r}; "
                             f"expected one of {sorted(_EMBODIMENT_TO_RAW_ACTION_DIM)}",
                             param="domain_name")
    width = _EMBODIMENT_TO_RAW_ACTION_DIM.get(action.domain_name)
    if width is None:
        raise InvalidRequest(f"domain_name={action.domain_name!r} is not supported for action "
                             "inference: it has no canonical action width. Supported domains: "
                             f"{sorted(_EMBODIMENT_TO_RAW_ACTION_DIM)}", param="domain_name")
    if width > (runner.padded_action_dim or 0):
        raise InvalidRequest(f"domain {action.domain_name!r} has {width}-D actions, more than "
                             f"this model's action_dim {runner.padded_action_dim}",
                             param="domain_name")
    if str(action.resolution_tier) not in _ACTION_RESOLUTION_BINS:
        raise InvalidRequest(f"Unsupported action resolution_tier={action.resolution_tier!r}; "
                             f"expected one of {sorted(int(k) for k in _ACTION_RESOLUTION_BINS)}",
                             param="resolution_tier")
    _check_observation(params, action)
    if action.mode == "forward_dynamics":
        _check_raw_actions(action, width)


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
    if any(len(row) != width for row in rows):
        bad = next(len(row) for row in rows if len(row) != width)
        raise InvalidRequest(f"`action` width ({bad}) does not match the expected action width "
                             f"({width}) for domain_name={action.domain_name!r}", param="action")
