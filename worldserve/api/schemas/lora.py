"""The per-request `lora` field (images, videos, actions): which loaded adapters to apply.

`"name"`, `{"name": ..., "scale": ...}` or a list of either. Requests select adapters an
operator loaded (POST /admin/lora/load) by name; they never name a path.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from worldserve.errors import InvalidRequest
from worldserve.ipc.messages import LoraRef

MAX_ADAPTERS_PER_REQUEST = 8
MAX_SCALE = 100.0
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # fullmatch: `$` would let a final "\n" in


def parse_lora(value: Any, param: str = "lora") -> list[LoraRef]:
    """The selection as `LoraRef`s (scale None = the adapter's loaded scale); 400 naming the
    problem for anything else."""
    if isinstance(value, str) and value.strip()[:1] in ("{", "["):  # a multipart form field
        try:
            value = json.loads(value)
        except ValueError:
            raise InvalidRequest(f"{param} is not valid JSON", param=param) from None
    if value is None or value == []:
        return []
    items = value if isinstance(value, list) else [value]
    if len(items) > MAX_ADAPTERS_PER_REQUEST:
        raise InvalidRequest(f"{param} selects at most {MAX_ADAPTERS_PER_REQUEST} adapters",
                             param=param)
    refs = [_ref(item, param) for item in items]
    names = [ref.name for ref in refs]
    if len(set(names)) != len(names):
        raise InvalidRequest(f"{param} names an adapter twice", param=param)
    return refs


def _ref(item: Any, param: str) -> LoraRef:
    if isinstance(item, str):
        item = {"name": item}
    if not isinstance(item, dict):
        raise InvalidRequest(f"{param} must be an adapter name, an object "
                             '{"name": ..., "scale": ...} or a list of them', param=param)
    unknown = sorted(set(item) - {"name", "scale"})
    if unknown:
        raise InvalidRequest(f"{param}: unknown key '{unknown[0]}' (requests select adapters "
                             "loaded with POST /admin/lora/load by name)", param=param)
    name = item.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise InvalidRequest(f"{param}.name must be 1-64 letters, digits, '_' or '-'",
                             param=param)
    scale = item.get("scale")
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) \
                or not math.isfinite(scale) or abs(scale) > MAX_SCALE:
            raise InvalidRequest(f"{param}.scale must be a number within ±{MAX_SCALE:g}",
                                 param=param)
        scale = float(scale)
    return LoraRef(name=name, scale=scale)
