"""The `world_model` actions protocol (spec native-media.md §4.1, §5.2.2, §5.4): the generation
model's own transformer predicts actions, declared by the stage as `action_api: "world_model"`
with its facts in `GenerationCapabilities.action_generation` (domains, widths, tiers).

Pure mapping, no I/O: an envelope's observation (an image for `policy`, a video for
`inverse_dynamics`) and parameters become one data-only generation request whose result carries
the actions (`candidate_count` runs that many seeds, the `mean` reducer averages them); the
forward-dynamics fields of `POST /v1/videos` become its `ActionCondition`. The static rules are
`worldserve/ipc/rules.py`'s, read from the same declaration.
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Any

import numpy as np

from worldserve.api.schemas.actions import ActionEnvelope
from worldserve.api.schemas.videos import VideoCreateRequest
from worldserve.errors import InvalidRequest
from worldserve.ipc.capabilities import GenerationCapabilities
from worldserve.ipc.messages import ActionCondition, GenerationParams, GenerationResult
from worldserve.ipc.rules import HorizonField, check_generation

ROUTE_MODES = ("policy", "inverse_dynamics")
# The protocol's defaults (spec §5.2.2); the horizon is the model's (`action_horizon`).
DEFAULT_FPS = 5.0
DEFAULT_GUIDANCE = 1.0
DEFAULT_SEED = 42
DEFAULT_SIZE = (832, 480)


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


def _condition(mode: str, horizon: int, name: str, caps: GenerationCapabilities,
               domain_id: Any, raw_action_dim: Any, tier: Any, view_point: Any,
               rows: list[list[float]] | None = None) -> ActionCondition:
    """The action run; omitted tier and view point take `ActionCondition`'s defaults."""
    optional = {"resolution_tier": _tier(tier) if tier else None,
                "view_point": str(view_point) if view_point else None}
    return ActionCondition(mode=mode, chunk_size=horizon,
                           domain_name=domain_name(name, domain_id, raw_action_dim, caps),
                           raw_actions=rows,
                           **{k: v for k, v in optional.items() if v is not None})


def _tier(value: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).isdigit():
        raise InvalidRequest(f"resolution_tier must be an integer (got {value!r:.40})",
                             param="resolution_tier")
    return int(value)


# ---------------------------------------------------------------------- /v1/videos


def forward_dynamics(body: VideoCreateRequest,
                     caps: GenerationCapabilities) -> tuple[ActionCondition, HorizonField]:
    """The `action_mode: forward_dynamics` fields of `/v1/videos`, and the field the horizon
    came from (`num_frames` when sent, else the rows of `action`)."""
    if body.action_mode is None:
        raise InvalidRequest("action needs action_mode 'forward_dynamics'", param="action")
    if body.action_mode != "forward_dynamics":
        raise InvalidRequest(f"action_mode {body.action_mode!r} predicts actions: use "
                             "POST /v1/actions/generations (/v1/videos takes "
                             "'forward_dynamics')", param="action_mode")
    rows = body.action or []
    if any(not math.isfinite(value) for row in rows for value in row):
        raise InvalidRequest("action must hold finite numbers", param="action")
    field: HorizonField = "num_frames" if body.num_frames is not None else "action"
    horizon = body.num_frames - 1 if body.num_frames is not None else len(rows)
    action = _condition("forward_dynamics", horizon, body.domain_name or "", caps,
                        body.domain_id, body.raw_action_dim, body.resolution_tier,
                        body.action_view_point, rows or None)
    return action, field


def job_action(action: ActionCondition, caps: GenerationCapabilities) -> dict[str, Any]:
    """The job object's `action` (spec §4.2): the rows a forward-dynamics job rolls out."""
    rows = action.raw_actions or []
    actions = caps.action_generation
    return {"data": rows, "shape": [len(rows), len(rows[0]) if rows else 0],
            "dtype": "float32",
            "raw_action_dim": actions.domains.get(action.domain_name) if actions else None,
            "action_mode": action.mode,
            "domain_id": actions.domain_ids.get(action.domain_name) if actions else None}


# ---------------------------------------------------------------------- /v1/actions/*


def params_of(env: ActionEnvelope, images: list[bytes], videos: list[bytes],
              caps: GenerationCapabilities) -> GenerationParams:
    """The data-only generation request of an envelope (after its media were read)."""
    p = env.parameters
    extra = p.model_extra or {}
    mode = p.action_mode or "policy"
    if mode == "forward_dynamics":
        raise InvalidRequest("action_mode 'forward_dynamics' generates video: use /v1/videos",
                             param="action_mode")
    if mode not in ROUTE_MODES:
        raise InvalidRequest(f"action_mode {mode!r} is not supported (supported: "
                             f"{', '.join(ROUTE_MODES)})", param="action_mode")
    if images and videos:
        raise InvalidRequest("image and video observations are mutually exclusive",
                             param="input.video")
    if len(images) > 1 or len(videos) > 1:
        raise InvalidRequest("this server takes one observation per action request "
                             "(batching_max_size 1)", param="input.images")
    actions = caps.action_generation
    horizon = p.action_horizon or (actions.action_horizon if actions else 16)
    action = _condition(mode, horizon, extra.get("domain_name") or "", caps,
                        extra.get("domain_id"), extra.get("raw_action_dim"),
                        extra.get("resolution_tier"), extra.get("action_view_point"))
    seed = p.seed if p.seed is not None else DEFAULT_SEED
    params = GenerationParams(
        prompt=env.task, width=0, height=0, num_frames=horizon + 1,
        num_inference_steps=p.num_inference_steps or caps.defaults.num_inference_steps,
        guidance_scale=_number(extra.get("guidance_scale"), "guidance_scale", DEFAULT_GUIDANCE,
                               minimum=0.0),
        seeds=[seed + i for i in range(p.candidate_count or 1)],
        fps=_number(extra.get("fps") or None, "fps", DEFAULT_FPS, minimum=None),
        condition_images=images[:1], condition_video=videos[0] if videos else None,
        action=action, lora=env.lora)
    check_generation(params, caps)
    return params


def _number(value: Any, name: str, default: float, minimum: float | None) -> float:
    """`parameters.<name>` as a finite float: >= `minimum`, or > 0 when `minimum` is None."""
    if value is None:
        return default
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InvalidRequest(f"parameters.{name} must be a number (got {value!r:.40})",
                             param=f"parameters.{name}") from None
    in_range = number >= minimum if minimum is not None else number > 0
    if not (math.isfinite(number) and in_range):
        bound = f">= {minimum:g}" if minimum is not None else "> 0"
        raise InvalidRequest(f"parameters.{name} must be a finite number {bound} (got "
                             f"{value!r:.40})", param=f"parameters.{name}")
    return number


def response(env: ActionEnvelope, params: GenerationParams, result: GenerationResult,
             model: str, use_msgpack: bool, infer_ms: float) -> dict[str, Any]:
    """The action envelope response (spec §5.2.4) with the world-model fields."""
    if not result.actions:
        raise InvalidRequest("the action run returned no actions")
    chunks = [np.frombuffer(a.values, "<f4").reshape(a.shape) for a in result.actions]
    first = result.actions[0]
    numpy_out = use_msgpack and (env.runtime.output_format or "numpy") == "numpy"
    if env.runtime.response_format == "raw":
        values = np.stack(chunks) if env.parameters.return_candidates else np.mean(chunks, 0)
        return {"actions": values if numpy_out else values.tolist()}
    picked = (list(enumerate(chunks)) if env.parameters.return_candidates
              else [(0, np.mean(chunks, axis=0).astype("<f4"))])
    data = [{"index": i, "input_index": 0, "candidate_index": i,
             "action": {"type": "continuous", "dtype": "float32", "shape": list(chunk.shape),
                        "values": chunk if numpy_out else chunk.tolist(),
                        "action_mode": first.action_mode, "domain_id": first.domain_id,
                        "raw_action_dim": int(chunk.shape[-1])}}
            for i, chunk in picked]
    body: dict[str, Any] = {
        "id": env.request_id or f"act_{uuid.uuid4().hex}", "object": "action.generation",
        "created": int(time.time()), "model": model, "data": data,
        "usage": {"batch_size": 1, "action_horizon": int(first.shape[0]),
                  "action_dim": int(first.shape[1]),
                  "denoise_steps": params.num_inference_steps, "prefix_cache_hit": False},
        "cache": None, "parallel": None}
    if env.runtime.return_timing:
        body["timings"] = {"infer_ms": infer_ms}
    return body


def metadata(caps: GenerationCapabilities, model: str, model_path: str | None) -> dict[str, Any]:
    """`GET /v1/actions/metadata` in the world-model shape (spec §5.4), from the declaration;
    `policy_family` is the family the stage names (information only)."""
    actions = caps.action_generation
    if actions is None:  # a stage that declares the protocol declares its facts
        raise InvalidRequest("the generation stage declares no action facts")
    width, height = DEFAULT_SIZE
    return {
        "object": "action.metadata", "model": model, "model_path": model_path,
        "policy_family": caps.family,
        "input": {"modalities": ["image", "video"], "supported_resolutions": [[width, height]],
                  "state_dim": None},
        "output": {"action_type": "continuous", "action_horizon": actions.action_horizon,
                   "action_dim": None, "padded_action_dim": actions.padded_action_dim,
                   "dtype": "float32"},
        "runtime": {"parallelism": {"num_gpus": 1, "tp_size": 1, "sp_degree": 1,
                                    "ulysses_degree": 1, "ring_degree": 1}},
        "defaults": {"action_mode": "policy", "action_horizon": actions.action_horizon,
                     "num_inference_steps": caps.defaults.num_inference_steps,
                     "height": height, "width": width, "fps": int(DEFAULT_FPS)},
        "capabilities": {"action_modes": list(ROUTE_MODES), "realtime_websocket": False,
                         "openpi_websocket": False, "batch_inputs": False, "max_batch_size": 1,
                         "batched_action_modes": ["policy"], "multiple_candidates": True},
        "domains": {name: {"domain_id": actions.domain_ids.get(name), "raw_action_dim": width}
                    for name, width in sorted(actions.domains.items())},
        "resolution_tiers": list(actions.resolution_tiers),
        "view_points": list(actions.view_points),
    }
