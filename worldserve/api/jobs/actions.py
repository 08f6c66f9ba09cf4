"""The action routes' parse and render steps (spec native-media.md §5): the request envelope
(JSON, msgpack or multipart) with its images, and the response body (JSON or msgpack arrays).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import msgpack
import numpy as np
from fastapi import Request

from worldserve.api.jobs.bodies import is_multipart, prepare, read_form, read_json
from worldserve.api.schemas.actions import ActionEnvelope, decode_numpy, parse_envelope
from worldserve.errors import InvalidRequest
from worldserve.ipc.capabilities import ActionHeadCapabilities
from worldserve.ipc.messages import ActionsResult
from worldserve.media.images import check_image
from worldserve.media.policy import MediaPolicy, check_request_id
from worldserve.media.uploads import read_image_reference, read_upload
from worldserve.media.video import check_video


async def read_action_request(request: Request, policy: MediaPolicy, limit: int,
                              caps: ActionHeadCapabilities) -> tuple[ActionEnvelope, list[bytes]]:
    """The validated envelope and every observation image (uploads, inline, references)."""
    payload, uploads = await _payload(request, limit)
    for key in ("request_id", "id"):
        check_request_id(payload.get(key), key)
    env = parse_envelope(prepare(payload, policy))
    _check_parameters(env, caps)
    images = list(env.images) + uploads
    for ref in env.references:
        images.append(await read_image_reference(ref, "input.image", limit, policy))
    for image in images:
        check_image(image, "input.observation.images")
    return env, images


def _check_parameters(env: ActionEnvelope, caps: ActionHeadCapabilities) -> None:
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


async def _payload(request: Request, limit: int) -> tuple[dict[str, Any], list[bytes]]:
    payload, images, _ = await payload_of(request, limit)
    return payload, images


async def payload_of(request: Request, limit: int, *, accept_video: bool = False,
                     ) -> tuple[dict[str, Any], list[bytes], list[bytes]]:
    """The envelope map and its uploads (images; videos when `accept_video`, Cosmos3)."""
    kind = request.headers.get("content-type", "").lower()
    uploads: list[bytes] = []
    videos: list[bytes] = []
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
        return payload, uploads, videos
    if is_multipart(request):
        form = await read_form(request)
        for name, files in form.files.items():
            if name == "video" and accept_video:
                for upload in files:
                    data = await read_upload(upload, name, limit)
                    check_video(data, name)
                    videos.append(data)
                continue
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
        return payload, uploads, videos
    return await read_json(request), uploads, videos


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
