"""Operator routes on the served models (docs/admin.md), behind the admin key rules.

Each route relays one typed admin message (ipc/messages/) to the stage that owns the model;
the engine applies it between two steps. Bad bodies are 400 (OpenAI error envelope), as are
the engine's refusals (missing LoRA path, unknown adapter, mismatching tensor).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from worldserve.api.errors import OpenAIRoute
from worldserve.api.routes.ops import query_stages
from worldserve.api.runtime import ServerRuntime
from worldserve.api.security import require_admin
from worldserve.errors import InternalError, InvalidRequest
from worldserve.ipc.client import new_request_id
from worldserve.ipc.messages import (
    AdminRequest,
    AdminResult,
    GenerationContinue,
    GenerationPause,
    LoraList,
    LoraLoad,
    LoraUnload,
    MemoryRelease,
    MemoryResume,
    ModelInfoRequest,
    WeightsUpdate,
)

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[Depends(require_admin)],
                   route_class=OpenAIRoute)

MODEL_STAGE = "generation"  # the stage whose model LoRA, weights and pause apply to
ADMIN_CALL_TIMEOUT_S = 120.0
# Weights update and memory release wait for the running requests to finish first.
DRAINED_CALL_TIMEOUT_S = 3600.0
MODEL_INFO_TIMEOUT_S = 5.0
MAX_PATH_CHARS = 4096


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoraLoadBody(_Body):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$",
                      description="adapter name requests select it by")
    path: str = Field(min_length=1, max_length=MAX_PATH_CHARS,
                      description="a diffusers/PEFT LoRA directory or .safetensors file on the "
                                  "server")
    scale: float = Field(default=1.0, ge=-100, le=100,
                         description="default scale when a request names the adapter only")
    path_2: str | None = Field(default=None, min_length=1, max_length=MAX_PATH_CHARS,
                               description="Wan 2.2 A14B: the same adapter's file for the "
                                           "low-noise expert (transformer_2)")


class LoraUnloadBody(_Body):
    name: str = Field(min_length=1, max_length=64)


class WeightsUpdateBody(_Body):
    path: str = Field(min_length=1, max_length=MAX_PATH_CHARS,
                      description="directory with transformer[_2]/*.safetensors or *.safetensors")


class StageBody(_Body):
    stage: str = Field(default=MODEL_STAGE, max_length=32,
                       description="the stage whose weights move (an enabled stage)")


def _enabled_stage(request: Request, body: StageBody | None) -> str:
    """The body's stage; 400 naming the enabled ones when it is not enabled here."""
    stage = (body or StageBody()).stage
    clients = _runtime(request).clients
    if stage not in clients:
        raise InvalidRequest(f"stage {stage!r} is not enabled on this server (enabled: "
                             f"{', '.join(clients) or 'none'})", param="stage")
    return stage


def _runtime(request: Request) -> ServerRuntime:
    return request.app.state.runtime


async def relay(request: Request, msg: AdminRequest, stage: str = MODEL_STAGE,
                timeout_s: float = ADMIN_CALL_TIMEOUT_S) -> dict[str, Any]:
    """Send one admin message to `stage`; its `AdminResult.data` (errors raise as themselves)."""
    reply = await _runtime(request).client(stage).call(msg, timeout_s=timeout_s)
    if not isinstance(reply, AdminResult):
        raise InternalError(f"unexpected reply {type(reply).__name__} to {type(msg).__name__}")
    return {"stage": stage, **reply.data}


@router.get("/model_info")
async def model_info(request: Request) -> dict:
    """Per stage: the loaded model, what it supports, its LoRA adapters and memory state."""
    stages = await query_stages(
        _runtime(request), lambda: ModelInfoRequest(request_id=new_request_id("info")),
        lambda reply: reply.data if isinstance(reply, AdminResult) else {},
        MODEL_INFO_TIMEOUT_S)
    return {"stages": stages}


@router.get("/lora")
async def lora_list(request: Request) -> dict:
    return await relay(request, LoraList(request_id=new_request_id("lora")))


@router.post("/lora/load")
async def lora_load(body: LoraLoadBody, request: Request) -> dict:
    msg = LoraLoad(request_id=new_request_id("lora"), name=body.name, path=body.path,
                   scale=body.scale, path_2=body.path_2)
    return await relay(request, msg)


@router.post("/lora/unload")
async def lora_unload(body: LoraUnloadBody, request: Request) -> dict:
    return await relay(request, LoraUnload(request_id=new_request_id("lora"), name=body.name))


@router.post("/weights/update")
async def weights_update(body: WeightsUpdateBody, request: Request) -> dict:
    """Waits for running requests to finish (on the old weights); queued ones get the new."""
    msg = WeightsUpdate(request_id=new_request_id("weights"), path=body.path)
    return await relay(request, msg, timeout_s=DRAINED_CALL_TIMEOUT_S)


@router.post("/memory/release")
async def memory_release(request: Request, body: StageBody | None = None) -> dict:
    """Weights off the device once running requests finish; the stage answers 503 until
    resume."""
    stage = _enabled_stage(request, body)
    msg = MemoryRelease(request_id=new_request_id("memory"))
    return await relay(request, msg, stage=stage, timeout_s=DRAINED_CALL_TIMEOUT_S)


@router.post("/memory/resume")
async def memory_resume(request: Request, body: StageBody | None = None) -> dict:
    stage = _enabled_stage(request, body)
    return await relay(request, MemoryResume(request_id=new_request_id("memory")), stage=stage)


@router.post("/generation/pause")
async def generation_pause(request: Request) -> dict:
    """No new step starts: running requests hold at a step boundary, new ones queue."""
    return await relay(request, GenerationPause(request_id=new_request_id("pause")))


@router.post("/generation/continue")
async def generation_continue(request: Request) -> dict:
    return await relay(request, GenerationContinue(request_id=new_request_id("pause")))
