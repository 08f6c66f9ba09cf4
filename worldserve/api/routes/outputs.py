"""`POST /admin/outputs/prune`: run the retention sweep now and report what it removed."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from worldserve.api.security import require_admin
from worldserve.api.services import ApiServices, media_service

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[Depends(require_admin)])


def setup(services: ApiServices) -> bool:
    return services.media is not None


@router.post("/outputs/prune")
async def prune(request: Request) -> dict[str, Any]:
    return media_service(request).prune()
