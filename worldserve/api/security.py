"""Admin authentication: a bearer key, or loopback-only when no key is set."""

from __future__ import annotations

import hmac

from fastapi import Request

from worldserve.config import is_loopback_host
from worldserve.errors import AuthenticationRequired, PermissionDenied


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
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthenticationRequired("admin routes need 'Authorization: Bearer <admin key>'")
    if not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise PermissionDenied("the admin key is not valid")
