"""The clients' side of the server's `--api-key` (api/security.py): the key goes in
`Authorization: Bearer <key>`, on HTTP requests and WebSocket upgrades alike (never in a URL,
where access logs would keep it)."""

from __future__ import annotations

from worldserve import envs

API_KEY_HELP = ("The server's --api-key, sent as 'Authorization: Bearer <key>' "
                "(default: $WORLDSERVE_API_KEY, the variable the server reads too).")
MISSING_KEY_HINT = "the server needs an API key: pass --api-key or set WORLDSERVE_API_KEY"


def resolve_api_key(flag: str | None) -> str | None:
    """The `--api-key` flag, else WORLDSERVE_API_KEY, else None (an open server)."""
    key = (flag or "").strip()
    return key or envs.api_key()


def bearer_headers(api_key: str | None) -> dict[str, str]:
    """The headers that carry `api_key`; none without one."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}
