"""Extra-parameter flattening (spec native-media.md §2.2)."""

from __future__ import annotations

import json
from typing import Any

from worldserve.errors import InvalidRequest

EXTRA_CONTAINERS = ("extra_body", "extra_json", "extra_args", "extra_params")


def _container(name: str, value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            return parsed
    # Upstream drops a malformed container silently; refusing it means a typo cannot change
    # generation parameters unnoticed (spec [D]).
    raise InvalidRequest(f"{name} must be a JSON object", param=name)


def flatten_extras(payload: dict[str, Any]) -> dict[str, Any]:
    """A copy of `payload` with the extra containers merged in, set-if-absent, in order."""
    out = {k: v for k, v in payload.items() if k not in EXTRA_CONTAINERS}
    for name in EXTRA_CONTAINERS:
        value = payload.get(name)
        if value is None:
            continue
        for key, item in _container(name, value).items():
            out.setdefault(key, item)
    if "guardrails" in out:
        out.setdefault("use_guardrails", out["guardrails"])
    return out
