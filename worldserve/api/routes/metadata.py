"""Root NIM discovery routes: `GET /v1/metadata` (spec streaming-reasoning 3.2), `/v1/manifest`,
`/v1/version`, `/v1/license`, describing the runtime `--nim-runtime` names (default: the
reasoner when enabled, else the generator). The /nim/<runtime> mounts (routes/nim.py) describe
their own runtime each."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from worldserve.api.nim.profile import (
    LICENSE,
    manifest_body,
    metadata_body,
    root_runtime,
    version_body,
)

router = APIRouter(tags=["operations"])


@router.get("/v1/metadata")
async def metadata(request: Request) -> dict[str, Any]:
    runtime = request.app.state.runtime
    return metadata_body(runtime, root_runtime(runtime))


@router.get("/v1/manifest")
async def manifest(request: Request) -> dict[str, Any]:
    runtime = request.app.state.runtime
    return manifest_body(runtime, root_runtime(runtime))


@router.get("/v1/version")
async def version() -> dict[str, Any]:
    return version_body()


@router.get("/v1/license")
async def license_info() -> dict[str, Any]:
    return dict(LICENSE)
