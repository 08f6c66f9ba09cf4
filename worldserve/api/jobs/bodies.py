"""Reading native-route request bodies: JSON or multipart, then flattening and the policy."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.datastructures import UploadFile

from worldserve.errors import InvalidRequest, UnsupportedMediaType, WorldserveError
from worldserve.media.extras import flatten_extras
from worldserve.media.policy import MediaPolicy, check_forbidden_fields, check_prompt_lengths

MAX_FORM_FIELDS = 1000


class FormBody:
    """A parsed multipart body: plain fields (last value wins, lists kept) and files."""

    def __init__(self, fields: dict[str, Any], files: dict[str, list[UploadFile]]) -> None:
        self.fields = fields
        self.files = files


async def read_json(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = json.loads(raw) if raw.strip() else {}
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"Invalid request body: body is not valid JSON ({exc})") from None
    except RecursionError:
        raise InvalidRequest("Invalid request body: JSON is nested too deeply") from None
    if not isinstance(body, dict):
        raise InvalidRequest("Invalid request body: the JSON body must be an object")
    return body


async def read_form(request: Request) -> FormBody:
    try:
        form = await request.form(
            max_files=MAX_FORM_FIELDS, max_fields=MAX_FORM_FIELDS, max_part_size=16 * 1024 * 1024
        )
    except WorldserveError:  # e.g. 413 from the body-size limit
        raise
    except Exception as exc:  # starlette raises assorted parser errors for malformed multipart
        raise InvalidRequest(f"Invalid request body: malformed multipart form ({exc})") from None
    fields: dict[str, Any] = {}
    files: dict[str, list[UploadFile]] = {}
    for key, value in form.multi_items():
        if isinstance(value, UploadFile):
            files.setdefault(key, []).append(value)
        elif key.endswith("[]"):
            fields.setdefault(key, []).append(value)
        elif key in fields:
            existing = fields[key]
            fields[key] = (existing if isinstance(existing, list) else [existing]) + [value]
        else:
            fields[key] = value
    return FormBody(fields, files)


def is_multipart(request: Request) -> bool:
    return request.headers.get("content-type", "").lower().startswith("multipart/form-data")


def is_urlencoded(request: Request) -> bool:
    kind = request.headers.get("content-type", "").lower()
    return kind.startswith("application/x-www-form-urlencoded")


def require_json_or_form(request: Request) -> None:
    kind = request.headers.get("content-type", "").lower()
    if kind and not (
        kind.startswith("application/json")
        or kind.startswith("multipart/form-data")
        or "+json" in kind
        or kind.startswith("text/plain")
    ):
        raise UnsupportedMediaType(
            f"Content-Type {kind!r} is not supported; send application/json or multipart/form-data"
        )


def prepare(payload: dict[str, Any], policy: MediaPolicy) -> dict[str, Any]:
    """Flatten the extra containers, then apply the forbidden-field rule and the media policy
    (after flattening, so nothing can be smuggled in through a container)."""
    flat = flatten_extras(payload)
    check_forbidden_fields(flat)
    check_prompt_lengths(flat)
    policy.scan(flat)
    return flat


def validate(model: type[BaseModel], payload: dict[str, Any], *, as_400: bool = False) -> Any:
    """pydantic validation; errors are 422 (FastAPI style) or 400 `Invalid request body: ...`."""
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        if as_400:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise InvalidRequest(
                f"Invalid request body: {loc}: {first['msg']}", param=loc or None
            ) from None
        from fastapi.exceptions import RequestValidationError

        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
        ) from None


async def read_payload(request: Request) -> FormBody:
    """A JSON or multipart body as fields and files (no files for JSON)."""
    require_json_or_form(request)
    if is_multipart(request):
        return await read_form(request)
    return FormBody(await read_json(request), {})


def parse_body(
    model: type[BaseModel], payload: dict[str, Any], policy: MediaPolicy, *, as_400: bool = False
) -> Any:
    """Flattening and the media policy (`prepare`), then the public schema (`validate`)."""
    return validate(model, prepare(payload, policy), as_400=as_400)
