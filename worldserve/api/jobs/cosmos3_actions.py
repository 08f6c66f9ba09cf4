"""`/v1/actions/*` on a Cosmos3 checkpoint (spec native-media.md §5.2.2, §5.4): the envelope's
observation (an image for `policy`, a video for `inverse_dynamics`) and parameters become one
data-only generation request (`output_format` "none") whose result carries the actions;
`candidate_count` runs that many seeds and the `mean` reducer averages them."""

from __future__ import annotations

import time
import uuid
from typing import Any

import numpy as np
from fastapi import Request

from worldserve.api.jobs.actions import payload_of
from worldserve.api.jobs.bodies import prepare
from worldserve.api.jobs.cosmos3 import DEFAULT_RESOLUTION_TIER, DEFAULT_VIEW_POINT, domain_name
from worldserve.api.schemas.actions import ActionEnvelope, parse_envelope
from worldserve.errors import InvalidRequest, NotFound
from worldserve.ipc.capabilities import GenerationCapabilities
from worldserve.ipc.messages import ActionCondition, GenerationParams, GenerationResult
from worldserve.media.images import check_image
from worldserve.media.policy import MediaPolicy, check_request_id
from worldserve.media.uploads import read_image_reference, read_video_reference

ROUTE_MODES = ("policy", "inverse_dynamics")
VIDEO_KEYS = ("video", "video_path")
DEFAULT_HORIZON = 16
DEFAULT_FPS = 5.0
DEFAULT_GUIDANCE = 1.0
DEFAULT_SEED = 42


def require_actions(caps: GenerationCapabilities, model: str) -> None:
    """404 unless the Cosmos3 checkpoint has action heads (spec §5.1)."""
    if caps.action_generation is None:
        raise NotFound(f"model '{model}' has no action heads (its transformer has action_gen: "
                       "false): action generation is not available on this server")


async def read_request(request: Request, policy: MediaPolicy, limit: int,
                       caps: GenerationCapabilities, defaults_steps: int,
                       ) -> tuple[ActionEnvelope, GenerationParams]:
    """The validated envelope and the generation parameters of its action run."""
    payload, images, videos = await payload_of(request, limit, accept_video=True)
    for key in ("request_id", "id"):
        check_request_id(payload.get(key), key)
    payload = prepare(payload, policy)
    inp = payload.get("input") if isinstance(payload.get("input"), dict) else {}
    video_refs = [inp.pop(key) for key in VIDEO_KEYS if inp.get(key)]
    env = parse_envelope(payload)
    images = list(env.images) + images
    for ref in env.references:
        images.append(await read_image_reference(ref, "input.image", limit, policy))
    for ref in video_refs:
        if not isinstance(ref, str):
            raise InvalidRequest("input.video must be a path, URL or data URL", param="input.video")
        videos.append(await read_video_reference(ref, "input.video", limit, policy))
    for image in images:
        check_image(image, "input.image")
    try:
        return env, _params(env, images, videos, caps, defaults_steps)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"invalid action parameter: {exc}", param="parameters") from None


def _params(env: ActionEnvelope, images: list[bytes], videos: list[bytes],
            caps: GenerationCapabilities, defaults_steps: int) -> GenerationParams:
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
        raise InvalidRequest("this Cosmos3 server takes one observation per request "
                             "(batching_max_size 1)", param="input.images")
    horizon = p.action_horizon or DEFAULT_HORIZON
    action = ActionCondition(
        mode=mode, chunk_size=horizon,
        domain_name=domain_name(extra.get("domain_name"), extra.get("domain_id"),
                                extra.get("raw_action_dim"), caps),
        resolution_tier=int(extra.get("resolution_tier") or DEFAULT_RESOLUTION_TIER),
        view_point=str(extra.get("action_view_point") or DEFAULT_VIEW_POINT))
    seed = p.seed if p.seed is not None else DEFAULT_SEED
    count = p.candidate_count or 1
    return GenerationParams(
        prompt=env.task, width=0, height=0, num_frames=horizon + 1,
        num_inference_steps=p.num_inference_steps or defaults_steps,
        guidance_scale=float(extra.get("guidance_scale", DEFAULT_GUIDANCE)),
        seeds=[seed + i for i in range(count)], fps=float(extra.get("fps") or DEFAULT_FPS),
        condition_images=images[:1], condition_video=videos[0] if videos else None,
        action=action, lora=env.lora)


def response(env: ActionEnvelope, params: GenerationParams, result: GenerationResult,
             model: str, use_msgpack: bool, infer_ms: float) -> dict[str, Any]:
    """The action envelope response (spec §5.2.4) with the Cosmos3 fields."""
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
    """`GET /v1/actions/metadata` in the Cosmos3 shape (spec §5.4), from the checkpoint."""
    actions = caps.action_generation
    assert actions is not None
    return {
        "object": "action.metadata", "model": model, "model_path": model_path,
        "policy_family": "cosmos3",
        "input": {"modalities": ["image", "video"], "supported_resolutions": [[832, 480]],
                  "state_dim": None},
        "output": {"action_type": "continuous", "action_horizon": actions.action_horizon,
                   "action_dim": None, "padded_action_dim": actions.padded_action_dim,
                   "dtype": "float32"},
        "runtime": {"parallelism": {"num_gpus": 1, "tp_size": 1, "sp_degree": 1,
                                    "ulysses_degree": 1, "ring_degree": 1}},
        "defaults": {"action_mode": "policy", "action_horizon": actions.action_horizon,
                     "num_inference_steps": caps.defaults.num_inference_steps,
                     "height": 480, "width": 832, "fps": int(DEFAULT_FPS)},
        "capabilities": {"action_modes": list(ROUTE_MODES), "realtime_websocket": False,
                         "openpi_websocket": False, "batch_inputs": False, "max_batch_size": 1,
                         "batched_action_modes": ["policy"], "multiple_candidates": True},
        "domains": {name: {"domain_id": actions.domain_ids.get(name), "raw_action_dim": width}
                    for name, width in sorted(actions.domains.items())},
        "resolution_tiers": list(actions.resolution_tiers),
        "view_points": list(actions.view_points),
    }
