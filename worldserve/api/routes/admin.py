"""Admin routes: server info, per-stage stats, relay diagnostics. Guarded by `require_admin`."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

import worldserve
from worldserve.api.routes.ops import stage_stats
from worldserve.api.runtime import ServerRuntime
from worldserve.api.security import require_admin
from worldserve.ipc.client import new_request_id
from worldserve.ipc.messages import Echo

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[Depends(require_admin)])

ADMIN_STATS_TIMEOUT_S = 2.0
MAX_ECHO_BYTES = 8 * 1024 * 1024


class EchoBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    payload_bytes: int = Field(default=0, ge=0, le=MAX_ECHO_BYTES)
    delay_ms: float = Field(default=0.0, ge=0, le=60_000)


def _runtime(request: Request) -> ServerRuntime:
    return request.app.state.runtime


@router.get("/server_info")
async def server_info(request: Request) -> dict:
    runtime = _runtime(request)
    stages = {}
    for name, client in runtime.clients.items():
        info = client.info
        stages[name] = {
            "pid": runtime.stage_pids.get(name),
            "state": client.state,
            "model": info.model if info else None,
            "model_path": info.model_path if info else None,
            "num_params": info.num_params if info else None,
            "down_reason": client.down_reason,
        }
    return {
        "version": worldserve.__version__,
        "started_at": int(runtime.started_at),
        "admin_key_set": runtime.admin_key is not None,
        "config": runtime.config.model_dump(mode="json"),
        "stages": stages,
    }


@router.get("/stats")
async def stats(request: Request) -> dict:
    return {"stages": await stage_stats(_runtime(request), ADMIN_STATS_TIMEOUT_S)}


@router.post("/stages/{stage}/echo")
async def echo(stage: str, body: EchoBody, request: Request) -> dict:
    """Round trip through the stage's socket: measures the relay, touches no model."""
    client = _runtime(request).client(stage)
    started = time.perf_counter()
    msg = Echo(request_id=new_request_id("echo"), payload=b"\0" * body.payload_bytes,
               delay_ms=body.delay_ms)
    await client.call(msg, timeout_s=body.delay_ms / 1000 + 30)
    return {"stage": stage, "payload_bytes": body.payload_bytes,
            "round_trip_ms": (time.perf_counter() - started) * 1000}
