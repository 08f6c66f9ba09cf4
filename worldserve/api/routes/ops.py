"""Operations: health, readiness, models, metrics, version."""

from __future__ import annotations

import asyncio
from typing import Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

import worldserve
from worldserve.api.runtime import ServerRuntime
from worldserve.ipc import messages
from worldserve.ipc.capabilities import GenerationCapabilities, ReasonerCapabilities
from worldserve.ipc.client import new_request_id
from worldserve.ipc.messages import Reply, StageInfo, StageStats, StatsRequest

router = APIRouter(tags=["operations"])

STATS_TIMEOUT_S = 0.5


def overall_status(states: dict[str, str]) -> str:
    """`ok` when every stage is ready; else the worst state: unhealthy > starting > released
    (weights moved off the device by POST /admin/memory/release) > warming."""
    values = set(states.values())
    if values <= {"ready"}:
        return "ok"
    if values & {"failed", "stopped"}:
        return "unhealthy"
    if values & {"starting", "loading"}:
        return "starting"
    if "released" in values:
        return "released"
    return "warming"


def _runtime(request: Request) -> ServerRuntime:
    return request.app.state.runtime


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    states = _runtime(request).stage_states()
    status = overall_status(states)
    body = {"status": status, "running": status != "unhealthy", "stages": states}
    return JSONResponse(status_code=200 if status == "ok" else 503, content=body)


@router.get("/v1/health/live")
async def live() -> dict:
    return {"object": "health.response", "status": "live", "message": "Service is live."}


# The stage whose readiness /v1/health/ready (the NIM probe) reports: a NIM-style client only
# talks to the reasoner, so generation warm-up or a crashed realtime stage must not hide it.
PROBE_STAGE = "reasoner"


def probe_status(states: dict[str, str]) -> str:
    """`ok` once the reasoner stage is ready, whatever the other stages do; without a reasoner
    stage, every stage counts (as in /health)."""
    if PROBE_STAGE in states:
        return overall_status({PROBE_STAGE: states[PROBE_STAGE]})
    return overall_status(states)


@router.get("/v1/health/ready")
async def ready(request: Request) -> JSONResponse:
    states = _runtime(request).stage_states()
    status = probe_status(states)
    if status == "ok":
        body = {"object": "health.response", "status": "ready", "message": "Service is ready."}
        return JSONResponse(status_code=200, content=body)
    body = {"object": "health.response", "status": status, "message": "Service is not ready.",
            "stages": states}
    return JSONResponse(status_code=503, content=body)


# What each stage's model serves, for /v1/models (spec streaming-reasoning.md section 3.3).
STAGE_CAPABILITIES = {"generation": ["images", "videos"], "reasoner": ["chat_completions"],
                      "realtime": ["realtime_video"]}


def model_capabilities(runtime: ServerRuntime, stage: str) -> list[str]:
    info = runtime.clients[stage].info
    caps = info.capabilities if info is not None else None
    out = list(STAGE_CAPABILITIES.get(stage, []))
    if isinstance(caps, GenerationCapabilities) and caps.actions is not None:
        out.append("actions")
    enabled = runtime.config.stages.reasoner.streaming.enabled
    if isinstance(caps, ReasonerCapabilities) and caps.streaming and enabled:
        out.insert(0, "streaming_reasoning")
    return out


def max_model_len(info: StageInfo) -> int | None:
    caps = info.capabilities
    return caps.max_model_len if isinstance(caps, ReasonerCapabilities) else None


@router.get("/v1/models")
async def models(request: Request) -> dict:
    runtime = _runtime(request)
    data = []
    for stage, client in runtime.clients.items():
        if client.info is None:
            continue
        data.append({
            "id": client.info.model,
            "object": "model",
            "created": int(runtime.started_at),
            "owned_by": "worldserve",
            "root": client.info.model_path,
            "stage": stage,
            "max_model_len": max_model_len(client.info),
            "capabilities": model_capabilities(runtime, stage),
        })
    return {"object": "list", "data": data}


async def query_stages(runtime: ServerRuntime, make_request: Callable[[], messages.Request],
                       render: Callable[[Reply], dict], timeout_s: float) -> dict[str, dict]:
    """Ask every stage concurrently: its state plus `render(reply)`; a down or slow stage
    reports why instead."""

    async def one(stage: str) -> tuple[str, dict]:
        client = runtime.clients[stage]
        if client.down_reason is not None:
            return stage, {"state": client.state, "error": client.down_reason}
        try:
            reply = await client.call(make_request(), timeout_s=timeout_s)
        except Exception as exc:  # reported per stage; one slow stage must not hide the others
            return stage, {"state": client.state, "error": str(exc)}
        return stage, {"state": client.state, **render(reply)}

    pairs = await asyncio.gather(*(one(stage) for stage in runtime.clients))
    return dict(pairs)


def _render_stats(reply: Reply) -> dict:
    assert isinstance(reply, StageStats)
    return {"queue_depth": reply.queue_depth, "running": reply.running,
            "sessions": reply.sessions, **reply.extra}


async def stage_stats(runtime: ServerRuntime, timeout_s: float) -> dict[str, dict]:
    """Stats of every stage, queried concurrently; a down or slow stage reports why."""
    return await query_stages(runtime, lambda: StatsRequest(request_id=new_request_id("stats")),
                              _render_stats, timeout_s)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    runtime = _runtime(request)
    stats = await stage_stats(runtime, STATS_TIMEOUT_S)
    for stage, client in runtime.clients.items():
        runtime.metrics.stage_up.labels(stage).set(
            1 if client.state in ("ready", "released") else 0)
        runtime.metrics.weights_released.labels(stage).set(
            1 if client.state == "released" else 0)
        answered = "queue_depth" in stats[stage]
        if answered:
            runtime.metrics.queue_depth.labels(stage).set(stats[stage]["queue_depth"])
            runtime.metrics.running.labels(stage).set(stats[stage]["running"])
        runtime.metrics.stage_figures.update(stage, stats[stage] if answered else None)
    return Response(runtime.metrics.render(), media_type="text/plain; version=0.0.4")


@router.get("/version")
async def version() -> dict:
    """The server's version (vLLM and SGLang answer the same route)."""
    return {"version": worldserve.__version__}
