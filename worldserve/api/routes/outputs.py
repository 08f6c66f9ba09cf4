"""`POST /admin/outputs/prune`: run the retention sweep now and report what it removed."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from worldserve.api.jobs.service import service_of
from worldserve.api.runtime import ServerRuntime
from worldserve.api.security import require_admin

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[Depends(require_admin)])


def setup(runtime: ServerRuntime) -> bool:
    return "generation" in runtime.clients


@router.post("/outputs/prune")
async def prune(request: Request) -> dict[str, Any]:
    return service_of(request.app.state.runtime).prune()
