"""The playground page: `GET /` and its static files under `/web/...` (worldserve/web/).

Files are served from the installed package directory with a fixed content-type table (ES
modules must be `text/javascript`, whatever the host's mimetypes database says) and a strict
Content-Security-Policy: the page loads nothing that the server does not serve itself.

`GET /web/surfaces` tells the page which surfaces this server offers, read from the app's own
routes, so a tab can say "this server does not offer X" before trying; WebSocket routes cannot
answer 404 to a browser (a refused upgrade looks like a network error).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse
from starlette.routing import BaseRoute, WebSocketRoute

from worldserve.errors import NotFound

router = APIRouter(tags=["playground"], include_in_schema=False)

WEB_DIR = Path(__file__).resolve().parents[2] / "web"

CONTENT_TYPES: dict[str, str] = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".txt": "text/plain; charset=utf-8",
}

# 'self' covers same-origin ws:/wss: in CSP level 3; blob:/data: are for decoded media
# (generated images, video blobs, canvas snapshots).
CONTENT_SECURITY_POLICY = "; ".join([
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' blob: data:",
    "media-src 'self' blob: data: mediastream:",
    "connect-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
])
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # The page reloads cheaply; stale modules after an upgrade would be worse than a refetch.
    "Cache-Control": "no-cache",
}

# surface -> (method, route path) that must exist for the surface's tab to work.
SURFACE_ROUTES: dict[str, tuple[str, str]] = {
    "images": ("POST", "/v1/images/generations"),
    "videos": ("POST", "/v1/videos"),
    "streaming": ("WS", "/v1/streaming/ws"),
    "realtime": ("WS", "/v1/realtime_video/generate"),
}


def _static(path: Path) -> FileResponse:
    media_type = CONTENT_TYPES.get(path.suffix.lower(), "application/octet-stream")
    return FileResponse(path, media_type=media_type, headers=SECURITY_HEADERS)


def resolve_web_file(relative: str) -> Path:
    """The file under WEB_DIR named by `relative`, or NotFound (no escaping the folder)."""
    candidate = (WEB_DIR / relative).resolve()
    if not candidate.is_relative_to(WEB_DIR) or not candidate.is_file():
        raise NotFound(f"no playground file '{relative}'")
    if candidate.suffix.lower() not in CONTENT_TYPES:
        raise NotFound(f"no playground file '{relative}'")
    return candidate


def _route_signature(route: BaseRoute) -> set[tuple[str, str]]:
    path = getattr(route, "path", None)
    if not isinstance(path, str):
        return set()
    if isinstance(route, WebSocketRoute):
        return {("WS", path)}
    return {(method, path) for method in getattr(route, "methods", None) or ()}


def _walk(routes: list[BaseRoute]) -> Iterator[BaseRoute]:
    for route in routes:
        # FastAPI >= 0.165 keeps an included router as one nested route (`original_router`);
        # create_app includes routers without an include-time prefix, so paths are complete.
        nested = getattr(route, "original_router", None)
        if nested is not None:
            yield from _walk(nested.routes)
        else:
            yield route


def offered_surfaces(routes: list[BaseRoute]) -> dict[str, bool]:
    """surface -> whether its route is registered in this app."""
    present: set[tuple[str, str]] = set()
    for route in _walk(routes):
        present |= _route_signature(route)
    return {name: sig in present for name, sig in SURFACE_ROUTES.items()}


@router.get("/")
async def index() -> FileResponse:
    return _static(resolve_web_file("index.html"))


@router.get("/web/surfaces")
async def surfaces(request: Request) -> JSONResponse:
    return JSONResponse(offered_surfaces(request.app.routes), headers={"Cache-Control": "no-store"})


@router.get("/web/{relative:path}")
async def web_file(relative: str) -> FileResponse:
    return _static(resolve_web_file(relative))
