"""Action routes (spec native-media.md §5): generations (JSON / msgpack / multipart), metadata.

Served when the checkpoint has an action head; otherwise both answer 404 naming what is missing.
"""

from __future__ import annotations

import time
from typing import Any

import msgpack
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from worldserve.api.errors import NativeRoute
from worldserve.api.jobs import cosmos3_actions
from worldserve.api.jobs.actions import action_response, read_action_request
from worldserve.api.jobs.service import MediaService
from worldserve.api.schemas.actions import encode_numpy
from worldserve.api.services import ApiServices, media_service

router = APIRouter(tags=["actions"], route_class=NativeRoute)

MSGPACK_TYPE = "application/msgpack"


def setup(services: ApiServices) -> bool:
    return services.media is not None


_service = media_service


@router.get("/v1/actions/metadata")
async def metadata(request: Request) -> dict[str, Any]:
    service = _service(request)
    gen = service.capabilities()
    if gen.family == "cosmos3":
        cosmos3_actions.require_actions(gen, service.model_name())
        info = service.client().info
        return cosmos3_actions.metadata(gen, service.model_name(),
                                        info.model_path if info else None)
    caps = service.action_capabilities()
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


@router.post("/v1/actions/generations")
async def generations(request: Request) -> Response:
    service = _service(request)
    if service.capabilities().family == "cosmos3":
        return await _cosmos3_generations(request, service)
    caps = service.action_capabilities()
    env, images = await read_action_request(request, service.policy,
                                            service.runtime.config.max_upload_bytes, caps)
    result = await service.generate_actions(env, images)
    use_msgpack = "msgpack" in (request.headers.get("content-type", "") +
                                request.headers.get("accept", "")).lower()
    body = action_response(env, result, service.model_name(), use_msgpack)
    if use_msgpack:
        return Response(msgpack.packb(body, default=encode_numpy, use_bin_type=True),
                        media_type=MSGPACK_TYPE)
    return JSONResponse(body)


async def _cosmos3_generations(request: Request, service: MediaService) -> Response:
    caps = service.capabilities()
    cosmos3_actions.require_actions(caps, service.model_name())
    env, params = await cosmos3_actions.read_request(
        request, service.policy, service.runtime.config.max_upload_bytes, caps,
        caps.defaults.num_inference_steps)
    start = time.perf_counter()
    result = await service.generate_data(params)
    use_msgpack = _wants_msgpack(request)
    body = cosmos3_actions.response(env, params, result, service.model_name(), use_msgpack,
                                    (time.perf_counter() - start) * 1000)
    return _render(body, use_msgpack)


def _wants_msgpack(request: Request) -> bool:
    return "msgpack" in (request.headers.get("content-type", "") +
                         request.headers.get("accept", "")).lower()


def _render(body: dict[str, Any], use_msgpack: bool) -> Response:
    if use_msgpack:
        return Response(msgpack.packb(body, default=encode_numpy, use_bin_type=True),
                        media_type=MSGPACK_TYPE)
    return JSONResponse(body)
