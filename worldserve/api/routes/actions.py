"""Action routes (spec native-media.md §5): generations (JSON / msgpack / multipart), metadata.

Served when the checkpoint has an action head; otherwise both answer 404 naming what is missing.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import msgpack
import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from worldserve.api.errors import NativeRoute
from worldserve.api.jobs.bodies import is_multipart, prepare, read_form, read_json
from worldserve.api.jobs.service import MediaService
from worldserve.api.schemas.actions import decode_numpy, encode_numpy, parse_envelope
from worldserve.api.services import ApiServices, media_service
from worldserve.errors import InvalidRequest, NotFound
from worldserve.ipc.capabilities import ActionHeadCapabilities
from worldserve.ipc.client import new_request_id
from worldserve.ipc.messages import ActionsResult, GenerateActions
from worldserve.media.images import check_image
from worldserve.media.policy import check_request_id
from worldserve.media.uploads import read_image_reference, read_upload

router = APIRouter(tags=["actions"], route_class=NativeRoute)

ACTION_TIMEOUT_S = 300.0
MSGPACK_TYPE = "application/msgpack"


def setup(services: ApiServices) -> bool:
    return services.media is not None


_service = media_service


def _action_caps(service: MediaService) -> ActionHeadCapabilities:
    caps = service.capabilities().actions
    if caps is None:
        raise NotFound(f"model '{service.model_name()}' has no action head: action generation is "
                       "not available on this server (the checkpoint needs an action_head/ folder)")
    return caps


@router.get("/v1/actions/metadata")
async def metadata(request: Request) -> dict[str, Any]:
    service = _service(request)
    caps = _action_caps(service)
    info = service.client().info
    return {
        "object": "action.metadata", "model": service.model_name(),
        "model_path": info.model_path if info else None, "policy_family": "worldserve-flow",
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


async def _payload(request: Request, service: MediaService) -> tuple[dict[str, Any], list[bytes]]:
    kind = request.headers.get("content-type", "").lower()
    uploads: list[bytes] = []
    if "msgpack" in kind:
        try:
            payload = msgpack.unpackb(await request.body(), raw=False, object_hook=decode_numpy,
                                      strict_map_key=False)
        except InvalidRequest:
            raise
        except Exception as exc:
            raise InvalidRequest(f"Invalid request body: not a msgpack map ({exc})") from None
        if not isinstance(payload, dict):
            raise InvalidRequest("Invalid request body: the msgpack body must be a map")
        return payload, uploads
    if is_multipart(request):
        form = await read_form(request)
        limit = service.runtime.config.max_upload_bytes
        for name, files in form.files.items():
            if name != "image":
                raise InvalidRequest(f"unexpected file field {name!r}", param=name)
            for upload in files:
                uploads.append(await read_upload(upload, name, limit))
        raw = form.fields.pop("request", None)
        try:
            payload = json.loads(raw) if raw else {}
        except (ValueError, RecursionError):
            raise InvalidRequest("the 'request' form field must hold a JSON object") from None
        if not isinstance(payload, dict):
            raise InvalidRequest("the 'request' form field must hold a JSON object")
        payload.update({k: v for k, v in form.fields.items() if k not in payload})
        return payload, uploads
    return await read_json(request), uploads


@router.post("/v1/actions/generations")
async def generations(request: Request) -> Response:
    service = _service(request)
    caps = _action_caps(service)
    payload, uploads = await _payload(request, service)
    for key in ("request_id", "id"):
        check_request_id(payload.get(key), key)
    payload = prepare(payload, service.policy)
    env = parse_envelope(payload)
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
    limit = service.runtime.config.max_upload_bytes
    images = list(env.images) + uploads
    for ref in env.references:
        images.append(await read_image_reference(ref, "input.image", limit, service.policy))
    for image in images:
        check_image(image, "input.observation.images")
    count = params.candidate_count or 1
    msg = GenerateActions(
        request_id=new_request_id("act"), task=env.task, images=images,
        state=env.state.tobytes() if env.state is not None else b"",
        noise=env.noise.tobytes() if env.noise is not None else b"",
        num_inference_steps=params.num_inference_steps, action_horizon=params.action_horizon,
        seed=params.seed if params.seed is not None else 42, num_candidates=count)
    with service.admit():
        result = await service.client().call(msg, timeout_s=ACTION_TIMEOUT_S)
    assert isinstance(result, ActionsResult)  # the stage protocol guarantees it
    use_msgpack = "msgpack" in (request.headers.get("content-type", "") +
                                request.headers.get("accept", "")).lower()
    body = _response(env, result, service.model_name(), use_msgpack)
    if use_msgpack:
        return Response(msgpack.packb(body, default=encode_numpy, use_bin_type=True),
                        media_type=MSGPACK_TYPE)
    return JSONResponse(body)


def _response(env: Any, result: ActionsResult, model: str, use_msgpack: bool) -> dict[str, Any]:
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
