"""`GET /v1/metadata`: the runtime metadata NIM clients check before streaming (spec 3.2)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

import worldserve
from worldserve.api.runtime import ServerRuntime
from worldserve.ipc.capabilities import ReasonerCapabilities

router = APIRouter(tags=["operations"])


def _profile(runtime: ServerRuntime, stage: str, default_backend: str) -> tuple[str, str, str]:
    """(served model name, profile id, model url) of a stage."""
    client = runtime.clients.get(stage)
    stage_config = getattr(runtime.config.stages, stage)
    info = client.info if client is not None else None
    name = info.model if info else (stage_config.served_model_name or stage)
    caps = info.capabilities if info else None
    declared = caps if isinstance(caps, ReasonerCapabilities) else None
    backend = (declared.backend if declared else None) or getattr(stage_config, "backend",
                                                                  default_backend)
    dtype = (declared.dtype if declared else None) or stage_config.dtype
    url = info.model_path if info else str(stage_config.model_path or "")
    return name, f"worldserve:{name}:{backend}:{dtype}", url


def metadata_body(runtime: ServerRuntime) -> dict[str, Any]:
    reasoner = runtime.config.stages.reasoner
    if reasoner.enabled:
        name, profile, url = _profile(runtime, "reasoner", "hf")
        streaming = reasoner.streaming.enabled
        return {
            "model_type": "reasoner",
            "inference_endpoint": "/v1/chat/completions",
            "selectedModelProfileId": profile,
            "model_variant": None,
            "modelInfo": [{"shortName": name, "modelUrl": url}],
            "version": worldserve.__version__,
            "streaming": {"enabled": streaming, "websocket": streaming, "rest": streaming},
        }
    # Without a reasoning stage NIM clients must refuse this server (no /v1/infer here).
    name, profile, url = _profile(runtime, "generation", "diffusers")
    return {
        "model_type": "generator",
        "inference_endpoint": None,
        "selectedModelProfileId": profile,
        "model_variant": None,
        "modelInfo": [{"shortName": name, "modelUrl": url}],
        "version": worldserve.__version__,
        "streaming": {"enabled": False, "websocket": False, "rest": False},
    }


@router.get("/v1/metadata")
async def metadata(request: Request) -> dict[str, Any]:
    return metadata_body(request.app.state.runtime)
