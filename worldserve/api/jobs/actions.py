"""`/v1/actions/*` (spec native-media.md §5): the envelope read in one pass (JSON, msgpack or
multipart, with its images and videos), then the protocol the generation stage declares
(`GenerationCapabilities.action_api`):

- `flow_head`: a separate action head answers `GenerateActions` (this module);
- `world_model`: the generation model predicts actions in a data-only generation request
  (`api/jobs/world_actions.py`).

No declared protocol: both routes answer 404.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable

import msgpack
import numpy as np
from fastapi import Request

from worldserve.api.jobs import world_actions
from worldserve.api.jobs.inputs import RequestContext, is_multipart, prepare, read_form, read_json
from worldserve.api.schemas.actions import ActionEnvelope, decode_numpy, parse_envelope
from worldserve.errors import InvalidRequest, NotFound
from worldserve.ipc.capabilities import ActionHeadCapabilities, GenerationCapabilities
from worldserve.ipc.messages import ActionsResult
from worldserve.media.images import check_image
from worldserve.media.policy import check_request_id
from worldserve.media.uploads import read_image_reference, read_upload, read_video_reference
from worldserve.media.video import check_video

if TYPE_CHECKING:
    from worldserve.api.jobs.service import MediaService

VIDEO_KEYS = ("video", "video_path")


def require_protocol(caps: GenerationCapabilities, model: str) -> str:
    """The declared actions protocol, or 404 naming what the checkpoint lacks (spec §5.1)."""
    if caps.action_api is None:
        raise NotFound(f"model '{model}' generates no actions: action generation is not "
                       "available on this server (the checkpoint needs an action_head/ folder "
                       "or a transformer with action heads)")
    return caps.action_api


def metadata(service: MediaService) -> dict[str, Any]:
    """`GET /v1/actions/metadata` in the declared protocol's shape."""
    caps = service.capabilities()
    protocol = require_protocol(caps, service.model_name())
    info = service.client().info
    model_path = service.runtime.public_path(info.model_path, None) if info else None
    if protocol == "world_model":
        return world_actions.metadata(caps, service.model_name(), model_path)
    return _flow_metadata(_flow_head(caps), service.model_name(), model_path)


async def generate(request: Request, service: MediaService, use_msgpack: bool) -> dict[str, Any]:
    """`POST /v1/actions/generations`: the response body of the declared protocol."""
    context = service.request_context()
    protocol = require_protocol(context.caps, service.model_name())
    if protocol == "world_model":
        env, images, videos = await read_envelope(request, context, accept_video=True)
        params = world_actions.params_of(env, images, videos, context.caps)
        start = time.perf_counter()
        result = await service.generate_data(params)
        infer_ms = (time.perf_counter() - start) * 1000
        return world_actions.response(env, params, result, service.model_name(), use_msgpack,
                                      infer_ms)
    head = _flow_head(context.caps)
    env, images, _ = await read_envelope(request, context, accept_video=False,
                                         check=lambda env: _check_flow_parameters(env, head))
    return action_response(env, await service.generate_actions(env, images),
                           service.model_name(), use_msgpack)


# ---------------------------------------------------------------------- reading the envelope


async def read_envelope(request: Request, context: RequestContext, *, accept_video: bool,
                        check: Callable[[ActionEnvelope], None] | None = None,
                        ) -> tuple[ActionEnvelope, list[bytes], list[bytes]]:
    """The validated envelope (`check` runs before any reference is fetched) with every
    observation image and video read and checked."""
    limit, policy = context.max_upload_bytes, context.policy
    payload, images, videos = await payload_of(request, limit, accept_video=accept_video)
    for key in ("request_id", "id"):
        check_request_id(payload.get(key), key)
    payload = prepare(payload, policy)
    inp = payload.get("input") if isinstance(payload.get("input"), dict) else {}
    video_refs = [inp.pop(key) for key in VIDEO_KEYS if accept_video and inp.get(key)]
    env = parse_envelope(payload)
    if check is not None:
        check(env)
    for image in env.images:
        check_image(image, "input.observation.images")
    images = list(env.images) + images
    for ref in env.references:
        images.append(await read_image_reference(ref, "input.image", limit, policy))
    for ref in video_refs:
        if not isinstance(ref, str):
            raise InvalidRequest("input.video must be a path, URL or data URL", param="input.video")
        videos.append(await read_video_reference(ref, "input.video", limit, policy))
    return env, images, videos


async def payload_of(request: Request, limit: int, *, accept_video: bool = False,
                     ) -> tuple[dict[str, Any], list[bytes], list[bytes]]:
    """The envelope map and its uploads (images; videos when `accept_video`)."""
    kind = request.headers.get("content-type", "").lower()
    if "msgpack" in kind:
        return _msgpack_map(await request.body()), [], []
    if not is_multipart(request):
        return await read_json(request), [], []
    form = await read_form(request)
    images: list[bytes] = []
    videos: list[bytes] = []
    for name, files in form.files.items():
        if name not in ("image", "video") or (name == "video" and not accept_video):
            raise InvalidRequest(f"unexpected file field {name!r}", param=name)
        for upload in files:
            data = await read_upload(upload, name, limit)
            (check_video if name == "video" else check_image)(data, name)
            (videos if name == "video" else images).append(data)
    raw = form.fields.pop("request", None)
    try:
        payload = json.loads(raw) if raw else {}
    except (ValueError, RecursionError):
        raise InvalidRequest("the 'request' form field must hold a JSON object") from None
    if not isinstance(payload, dict):
        raise InvalidRequest("the 'request' form field must hold a JSON object")
    payload.update({k: v for k, v in form.fields.items() if k not in payload})
    return payload, images, videos


def _msgpack_map(raw: bytes) -> dict[str, Any]:
    try:
        payload = msgpack.unpackb(raw, raw=False, object_hook=decode_numpy, strict_map_key=False)
    except InvalidRequest:
        raise
    except Exception as exc:  # msgpack raises assorted errors for malformed input
        raise InvalidRequest("Invalid request body: not a msgpack map "
                             f"({type(exc).__name__})") from None
    if not isinstance(payload, dict):
        raise InvalidRequest("Invalid request body: the msgpack body must be a map")
    return payload


# ---------------------------------------------------------------------- flow head


def _flow_head(caps: GenerationCapabilities) -> ActionHeadCapabilities:
    if caps.actions is None:  # a stage that declares the protocol declares the head's shapes
        raise NotFound("the generation stage declares no action head")
    return caps.actions


def _check_flow_parameters(env: ActionEnvelope, caps: ActionHeadCapabilities) -> None:
    params = env.parameters
    if params.action_mode not in (None, "policy"):
        if params.action_mode == "forward_dynamics":
            raise InvalidRequest("action_mode 'forward_dynamics' generates video: use /v1/videos",
                                 param="action_mode")
        raise InvalidRequest(f"action_mode {params.action_mode!r} is not supported by this "
                             "action head (supported: policy)", param="action_mode")
    if params.action_dim is not None and params.action_dim != caps.action_dim:
        raise InvalidRequest(f"action_dim must be {caps.action_dim} for this action head",
                             param="action_dim")


def _flow_metadata(caps: ActionHeadCapabilities, model: str,
                   model_path: str | None) -> dict[str, Any]:
    return {
        "object": "action.metadata", "model": model, "model_path": model_path,
        "policy_family": "worldserve-flow",
        "input": {"image_keys": None, "image_size": [caps.image_size, caps.image_size],
                  "state_dim": caps.state_dim, "max_images": caps.max_images},
        "output": {"action_type": "continuous", "action_horizon": caps.action_horizon,
                   "action_dim": caps.action_dim, "padded_action_dim": caps.action_dim,
                   "dtype": "float32"},
        "runtime": {"materialize_dtype": "float32", "enable_autocast": False,
                    "parallelism": {"num_gpus": 0, "tp_size": 1, "sp_degree": 1,
                                    "ulysses_degree": 1, "ring_degree": 1}},
        "defaults": {"num_inference_steps": caps.num_inference_steps,
                     "action_horizon": caps.action_horizon, "prefix_cache": False,
                     "cuda_graph": False},
        "capabilities": {"exact_prefix_cache": False, "cuda_graph": False,
                         "realtime_websocket": False, "openpi_websocket": False,
                         "batch_inputs": False, "multiple_candidates": True,
                         "max_candidates": caps.max_candidates},
    }


def action_response(env: ActionEnvelope, result: ActionsResult, model: str,
                    use_msgpack: bool) -> dict[str, Any]:
    """The action generation body; arrays stay numpy for msgpack, lists for JSON."""
    values = np.frombuffer(result.values, "<f4").reshape(
        result.num_candidates, result.action_horizon, result.action_dim)
    # JSON cannot carry raw arrays: `numpy` applies to msgpack responses only.
    numpy_out = use_msgpack and (env.runtime.output_format or "numpy") == "numpy"
    if env.runtime.response_format == "raw":
        actions = values if env.parameters.return_candidates else values.mean(axis=0)
        return {"actions": actions if numpy_out else actions.tolist()}
    if env.parameters.return_candidates:
        chunks = list(enumerate(values))
    else:
        chunks = [(0, values.mean(axis=0) if result.num_candidates > 1 else values[0])]
    data = []
    for index, chunk in chunks:
        chunk = np.ascontiguousarray(chunk, dtype="<f4")
        data.append({"index": index, "input_index": 0, "candidate_index": index,
                     "action": {"type": "continuous", "dtype": "float32",
                                "shape": list(chunk.shape),
                                "values": chunk if numpy_out else chunk.tolist(),
                                "action_mode": "policy"}})
    body: dict[str, Any] = {
        "id": env.request_id or f"act_{uuid.uuid4().hex}", "object": "action.generation",
        "created": int(time.time()), "model": model, "data": data,
        "usage": {"batch_size": 1, "action_horizon": result.action_horizon,
                  "action_dim": result.action_dim, "denoise_steps": result.num_inference_steps,
                  "prefix_cache_hit": False},
        "cache": None, "parallel": None}
    if env.runtime.return_timing:
        body["timings"] = {"infer_ms": result.infer_ms}
    return body
