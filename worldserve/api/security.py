"""Who may call: the admin key (a bearer key, or loopback-only when no key is set) and the
`--api-key` that guards every inference route (docs/security.md)."""

from __future__ import annotations

import hashlib
import hmac

from fastapi import Request
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from worldserve.config import is_loopback_host
from worldserve.errors import AuthenticationRequired, PermissionDenied, error_body


def require_admin(request: Request) -> None:
    """FastAPI dependency for /admin routes."""
    key: str | None = request.app.state.runtime.admin_key
    if key is None:
        host = request.client.host if request.client else ""
        if not is_loopback_host(host):
            raise PermissionDenied(
                "admin routes answer only loopback clients when no admin key is set; "
                "set WORLDSERVE_ADMIN_KEY or pass --admin-key-file to allow remote access"
            )
        return
    token = bearer_token(request.headers)
    if token is None:
        raise AuthenticationRequired("admin routes need 'Authorization: Bearer <admin key>'")
    if not key_matches(token, key):
        raise PermissionDenied("the admin key is not valid")


# --------------------------------------------------------------------------- --api-key

# What stays open when --api-key is set, as vLLM leaves its health, version and metrics routes
# open (vllm/entrypoints/openai/server_utils.py PUBLIC_ENDPOINTS): probes, scraping, the API
# docs and the playground's static files. /admin has its own key (require_admin). Matched on
# whole path segments, at the root and under each /nim/<runtime> mount.
OPEN_PATHS = ("/health", "/metrics", "/version", "/docs", "/redoc", "/openapi.json", "/web",
              "/admin", "/v1/health", "/v1/metadata", "/v1/manifest", "/v1/version",
              "/v1/license")
NIM_MOUNT = "/nim/"


def _covers(path: str, open_path: str) -> bool:
    return path == open_path or path.startswith(open_path + "/")


def is_open_path(path: str) -> bool:
    """True for the routes --api-key leaves open; every other path (unknown ones too) is
    guarded, so that a route added later is guarded by default."""
    if path == "/":  # the playground page
        return True
    if path.startswith(NIM_MOUNT):  # /nim/<runtime>/v1/... answers as /v1/...
        runtime_end = path.find("/", len(NIM_MOUNT))
        path = path[runtime_end:] if runtime_end != -1 else "/"
    return any(_covers(path, open_path) for open_path in OPEN_PATHS)


def bearer_token(headers: Headers) -> str | None:
    """The token of `Authorization: Bearer <token>`; None without one."""
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def key_matches(token: str | None, key: str) -> bool:
    """Constant time in the token's content (hmac.compare_digest over equal-length digests,
    so neither the content nor the length of the key leaks through timing)."""
    if token is None:
        return False
    return hmac.compare_digest(hashlib.sha256(token.encode()).digest(),
                               hashlib.sha256(key.encode()).digest())


class ApiKeyMiddleware:
    """`--api-key`: every HTTP request and WebSocket upgrade outside `OPEN_PATHS` needs
    `Authorization: Bearer <key>`, else 401 in the OpenAI error shape with
    `WWW-Authenticate: Bearer` (a WebSocket upgrade gets that 401 instead of the upgrade).
    The key is read from the header only, as vLLM does, WebSockets included: a query parameter
    would land in access logs and proxies' logs."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] not in ("http", "websocket") or scope.get("method") == "OPTIONS"
                or is_open_path(scope["path"])):
            await self.app(scope, receive, send)
            return
        token = bearer_token(Headers(scope=scope))
        if key_matches(token, self.api_key):
            await self.app(scope, receive, send)
            return
        message = ("this server needs an API key: send 'Authorization: Bearer <key>'"
                   if token is None else "the API key is not valid")
        response = JSONResponse(status_code=401,
                                content=error_body(AuthenticationRequired(message)),
                                headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)
