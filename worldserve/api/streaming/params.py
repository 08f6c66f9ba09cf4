"""Effective retention and sampling of a new session (spec sections 4.2-4.3).

Retention: omitted -> the server policy; supplied -> library defaults plus the supplied fields.
Sampling: the server defaults overridden field by field. Grammar compilation and the admission
inequalities are the reasoner stage's job.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import msgspec
from pydantic import BaseModel, ValidationError

from worldserve.api.schemas.streaming import RetentionIn, SamplingIn
from worldserve.errors import InvalidRequest
from worldserve.ipc.messages import ReasonerRetention, ReasonerSampling

log = logging.getLogger("worldserve.api.streaming")

GUIDED_FIELDS = ("guided_json", "guided_choice", "guided_regex")


def _invalid(err: ValidationError, section: str) -> InvalidRequest:
    """`retention.max_video_segments: Input should be ...`; unknown keys named as such."""
    parts = []
    for item in err.errors():
        field = ".".join(str(p) for p in item["loc"])
        if item["type"] == "extra_forbidden":
            parts.append(f"unknown {section} field '{field}'")
        else:
            msg = item["msg"].removeprefix("Value error, ")
            parts.append(f"{section}.{field}: {msg}" if field else f"{section}: {msg}")
    return InvalidRequest("; ".join(parts), param=section)


def _validate(schema: type[BaseModel], data: Any, section: str) -> BaseModel:
    if not isinstance(data, dict):
        raise InvalidRequest(f"{section} must be a JSON object", param=section)
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise _invalid(exc, section) from None


def build_retention(
    supplied: dict[str, Any] | None,
    server_policy: ReasonerRetention,
    library: ReasonerRetention | None = None,
) -> ReasonerRetention:
    """Omitted -> the server policy; supplied -> `library` defaults (the engine's, fitted to
    the model; else ReasonerRetention's) plus the supplied fields."""
    if supplied is None:
        return msgspec.structs.replace(server_policy)
    given = _validate(RetentionIn, supplied, "retention").model_dump(exclude_unset=True)
    base = msgspec.to_builtins(library if library is not None else ReasonerRetention())
    retention = msgspec.convert({**base, **given}, ReasonerRetention)
    if (
        retention.max_text_tokens is not None
        and retention.max_text_tokens > retention.max_session_tokens
    ):
        raise InvalidRequest(
            f"retention.max_text_tokens ({retention.max_text_tokens}) must not "
            f"exceed max_session_tokens ({retention.max_session_tokens})",
            param="retention",
        )
    if "max_video_segments" not in given:
        log.warning(
            "a supplied retention object without max_video_segments gets the library "
            "default %d, not the server policy",
            retention.max_video_segments,
        )
    return retention


MAX_SCHEMA_DEPTH = 32


def _depth(value: Any) -> int:
    """Nesting depth of a JSON value, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_SCHEMA_DEPTH:
            break
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        )
        stack.extend((child, depth + 1) for child in children)
    return deepest


def schema_text(
    value: dict[str, Any] | str, field: str = "sampling.guided_json", param: str = "sampling"
) -> str:
    """A guided-decoding JSON Schema as compact text; 400 when it is not a JSON object or
    is nested more than MAX_SCHEMA_DEPTH levels (the grammar compiler recurses on it)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise InvalidRequest(f"{field} is not valid JSON: {exc}", param=param) from None
        except RecursionError:
            raise InvalidRequest(
                f"{field} is nested more than {MAX_SCHEMA_DEPTH} levels", param=param
            ) from None
    if not isinstance(value, dict):
        raise InvalidRequest(f"{field} must be a JSON Schema object", param=param)
    if _depth(value) > MAX_SCHEMA_DEPTH:
        raise InvalidRequest(f"{field} is nested more than {MAX_SCHEMA_DEPTH} levels", param=param)
    return json.dumps(value)


def build_sampling(supplied: dict[str, Any] | None, defaults: ReasonerSampling) -> ReasonerSampling:
    fields = msgspec.to_builtins(defaults)
    if supplied is not None:
        sampling = _validate(SamplingIn, supplied, "sampling")
        given = sampling.model_dump(exclude_unset=True)
        if sum(given.get(name) is not None for name in GUIDED_FIELDS) > 1:
            raise InvalidRequest(
                "at most one of guided_json, guided_choice, guided_regex may be set",
                param="sampling",
            )
        if given.get("guided_json") is not None:
            given["guided_json"] = schema_text(given["guided_json"])
        fields.update(given)
    return msgspec.convert(fields, ReasonerSampling)


def retention_view(retention: ReasonerRetention) -> dict[str, Any]:
    return msgspec.to_builtins(retention)


SAMPLING_VIEW_FIELDS = (
    "max_tokens",
    "temperature",
    "top_p",
    "repetition_penalty",
    "frequency_penalty",
)


def sampling_view(sampling: ReasonerSampling) -> dict[str, Any]:
    """The NIM's five fields, plus any extension field that differs from its default."""
    out = msgspec.to_builtins(sampling)
    default = msgspec.to_builtins(ReasonerSampling())
    return {k: v for k, v in out.items() if k in SAMPLING_VIEW_FIELDS or v != default.get(k)}
