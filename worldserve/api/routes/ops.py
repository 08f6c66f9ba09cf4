"""Operations: health, readiness, models, metrics, version."""

from __future__ import annotations

import asyncio
from typing import Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

import worldserve
from worldserve.api.model_names import model_entries, served_model
from worldserve.api.nim.profile import STAGES, root_runtime
from worldserve.api.runtime import ServerRuntime
from worldserve.ipc import messages
from worldserve.ipc.client import new_request_id
from worldserve.ipc.messages import Reply, StageStats, StatsRequest

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


def probe_status(states: dict[str, str], probe: str | None = None) -> str:
    """`ok` once the probed stage is ready (`probe`: --nim-runtime's stage, else the reasoner),
    whatever the other stages do; without that stage, every stage counts (as in /health)."""
    probe = probe or PROBE_STAGE
    if probe in states:
        return overall_status({probe: states[probe]})
    return overall_status(states)


@router.get("/v1/health/ready")
async def ready(request: Request) -> JSONResponse:
    runtime = _runtime(request)
    states = runtime.stage_states()
    nim = runtime.config.nim_runtime
    status = probe_status(states, "generation" if nim == "generator" else None)
    if status == "ok":
        body = {"object": "health.response", "status": "ready", "message": "Service is ready."}
        return JSONResponse(status_code=200, content=body)
    body = {"object": "health.response", "status": status, "message": "Service is not ready.",
            "stages": states}
    return JSONResponse(status_code=503, content=body)


@router.get("/v1/models")
async def models(request: Request) -> dict:
    runtime = _runtime(request)
    first = STAGES[root_runtime(runtime)]
    return {"object": "list", "data": model_entries(runtime, first=first)}


@router.get("/v1/models/{model_id:path}")
async def model(request: Request, model_id: str) -> dict:
    return served_model(_runtime(request), model_id)


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
