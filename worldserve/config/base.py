"""The pieces every config model shares: a frozen, strict base model, the config error, the
loopback check and the `server_args_overrides` plumbing."""

from __future__ import annotations

import ipaddress
from typing import Any

from pydantic import BaseModel, ConfigDict

LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}


class ConfigError(ValueError):
    """A configuration problem, with a message that names the setting."""


def is_loopback_host(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False



class FrozenConfig(BaseModel):
    """Validated once, frozen: unknown keys are refused, nothing is reassigned."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# server_args_overrides keys that worldserve owns (spec native-media.md section 1.3).
OWNED_OVERRIDES = frozenset({"gpu_ids", "base_gpu_id", "model_path", "scheduler_rpc_timeout"})


def lift_overrides(data: Any, lifted: dict[str, str], accepted: frozenset[str]) -> Any:
    """Move the `server_args_overrides` keys worldserve acts on into their stage fields (the
    seed's spelling, e.g. `warmup_mode`); refuse every key it would otherwise ignore."""
    if not isinstance(data, dict) or not isinstance(data.get("server_args_overrides"), dict):
        return data
    data = dict(data)
    overrides = dict(data["server_args_overrides"])
    for key, field_name in lifted.items():
        if key not in overrides:
            continue
        value = overrides.pop(key)
        if field_name in data and data[field_name] != value:
            raise ValueError(f"server_args_overrides.{key}={value!r} disagrees with "
                             f"{field_name}={data[field_name]!r}; set one of them")
        data[field_name] = value
    for key in overrides:
        if key in OWNED_OVERRIDES:
            raise ValueError(f"server_args_overrides.{key}: worldserve sets this itself")
        if key not in accepted:
            known = ", ".join(sorted({*lifted, *accepted}))
            raise ValueError(f"server_args_overrides.{key}: not a setting worldserve acts on "
                             f"(known: {known})")
    data["server_args_overrides"] = overrides
    return data


