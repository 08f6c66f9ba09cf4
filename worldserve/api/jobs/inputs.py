"""The native media routes' one pass over a request: HTTP body -> one validated `MediaRequest`.

A reader takes the body as JSON or a form and flattens the extra containers; one media pass
(`read_request_media`, media/uploads.py) then reads and checks the uploads, applies the media
policy and reads every referenced image or video (data URLs, http(s) URLs, allowed local
paths, each under the upload limit and checked once); the reader validates the public schema
and resolves the fields against the stage's declaration (`api/jobs/params.py`). The route then
makes one `MediaService` call with the result.

`video_request(fields, context)` is that pass without HTTP: another surface (a NIM route)
builds its dict of fields and gets the same validated request.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.datastructures import UploadFile

from worldserve.api.jobs.params import MediaRequest, resolve_image, resolve_video
from worldserve.api.schemas.images import ImageGenerationRequest, SamplingFields
from worldserve.api.schemas.videos import VideoCreateRequest
from worldserve.errors import InvalidRequest, UnsupportedMediaType, WorldserveError
from worldserve.ipc.capabilities import GenerationCapabilities
from worldserve.media.images import check_image
from worldserve.media.policy import MediaPolicy
from worldserve.media.uploads import (
    MediaRules,
    read_image_reference,
    read_request_media,
    read_upload,
)

log = logging.getLogger("worldserve.jobs")

MAX_FORM_FIELDS = 1000
MAX_LISTED_FIELDS = 8
EXTRA_CONTAINERS = ("extra_body", "extra_json", "extra_args", "extra_params")
EDIT_FILE_FIELDS = ("image", "image[]")
EDIT_URL_FIELDS = ("url", "url[]")


@dataclass(frozen=True)
class RequestContext:
    """What a request is read and validated against: the media policy, the upload limit and
    the generation stage's declaration."""

    policy: MediaPolicy
    max_upload_bytes: int
    caps: GenerationCapabilities

    def media_rules(self) -> MediaRules:
        return MediaRules(self.policy, self.max_upload_bytes, self.caps.video_conditioning)


class FormBody:
    """A parsed body: plain fields (last value wins, lists kept) and files (none for JSON)."""

    def __init__(self, fields: dict[str, Any], files: dict[str, list[UploadFile]]) -> None:
        self.fields = fields
        self.files = files


# ---------------------------------------------------------------------- the one-pass readers


async def video_request(fields: dict[str, Any], context: RequestContext,
                        files: dict[str, list[UploadFile]] | None = None) -> MediaRequest:
    """`POST /v1/videos` (JSON, a URL-encoded form, or multipart with `input_reference` /
    `video_reference` files; an `input_reference` that is a video conditions like
    `video_path`), its body given as fields (and files) -> the validated request: the extra
    containers flattened, one media pass (uploads, policy, references), the public schema,
    then the stage's declaration."""
    flat = flatten_extras(fields)
    media = await read_request_media(flat, files or {}, context.media_rules())
    body = validate(VideoCreateRequest, flat, as_400=True)
    request = resolve_video(body, media.images[:1], media.videos[0] if media.videos else None,
                            context.caps)
    return _noted(request, body, "/v1/videos")


async def read_images(request: Request, context: RequestContext) -> MediaRequest:
    """`POST /v1/images/generations` (JSON)."""
    require_json_or_form(request)
    body = parse_body(ImageGenerationRequest, await read_json(request), context.policy)
    default = context.caps.defaults.image_response_format
    request_ = resolve_image(body, [], context.caps, default_response_format=default)
    return _noted(request_, body, "/v1/images/generations")


async def read_edit(request: Request, context: RequestContext) -> MediaRequest:
    """`POST /v1/images/edits` (a form with `image` files and/or `url` references)."""
    caps = context.caps
    if not caps.image_edits:
        raise InvalidRequest(
            f"{caps.pipeline} has no image-edit mode: to condition generation on an image, "
            "POST /v1/videos with the image as input_reference (num_frames > 1)", param="image")
    if not (is_multipart(request) or is_urlencoded(request)):
        raise InvalidRequest("images/edits takes multipart/form-data with 'image' files or 'url'")
    form = await read_form(request)
    images = await _edit_uploads(form, context.max_upload_bytes)
    urls: list[str] = []
    for name in EDIT_URL_FIELDS:
        value = form.fields.pop(name, None)
        urls += value if isinstance(value, list) else ([value] if value else [])
    payload = prepare(form.fields, context.policy)  # the policy before anything is fetched
    for url in urls:
        images.append(await read_image_reference(url, "url", context.max_upload_bytes,
                                                 context.policy))
    if not images:
        raise RequestValidationError([{"type": "missing", "loc": ("body", "image"),
                                       "msg": "Field 'image' or 'url' is required"}])
    body = validate(ImageGenerationRequest, payload)
    request_ = resolve_image(body, images, caps, default_response_format="b64_json")
    return _noted(request_, body, "/v1/images/edits")


async def _edit_uploads(form: FormBody, limit: int) -> list[bytes]:
    images: list[bytes] = []
    for name in EDIT_FILE_FIELDS:
        for upload in form.files.pop(name, []):
            data = await read_upload(upload, name, limit)
            check_image(data, "image")
            images.append(data)
    form.files.pop("mask", None)  # accepted, ignored (spec §3.2)
    if form.files:
        raise InvalidRequest(f"unexpected file field(s): {', '.join(sorted(form.files))}")
    return images


def _noted(request: MediaRequest, body: SamplingFields, route: str) -> MediaRequest:
    """Unknown top-level fields are accepted (spec §0.3) but said: logged and warned, as are
    the known ones that do not act here (`compat_warnings`)."""
    request.warnings.extend(body.compat_warnings())
    unknown = sorted(body.model_extra or {})
    if unknown:
        names = ", ".join(ascii(name)[:64] for name in unknown[:MAX_LISTED_FIELDS])
        extra = len(unknown) - MAX_LISTED_FIELDS
        more = f" and {extra} more" if extra > 0 else ""
        request.warnings.append(f"unknown field(s) ignored: {names}{more}")
        log.info("%s: unknown field(s) ignored: %s%s", route, names, more)
    return request


# ---------------------------------------------------------------------- reading a body


async def read_payload(request: Request) -> FormBody:
    """A JSON, multipart or URL-encoded body as fields and files (no files for JSON). Form
    clients without a file to attach (vLLM-Omni's benchmark client) send URL-encoded fields."""
    if is_multipart(request) or is_urlencoded(request):
        return await read_form(request)
    require_json_or_form(request)
    return FormBody(await read_json(request), {})


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


def flatten_extras(payload: dict[str, Any]) -> dict[str, Any]:
    """A copy of `payload` with the extra containers merged in, set-if-absent, in order
    (spec native-media.md §2.2)."""
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


def _container(name: str, value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):
            parsed = None
        if isinstance(parsed, dict):
            return parsed
    # Upstream drops a malformed container silently; refusing it means a typo cannot change
    # generation parameters unnoticed (spec [D]).
    raise InvalidRequest(f"{name} must be a JSON object", param=name)


def prepare(payload: dict[str, Any], policy: MediaPolicy) -> dict[str, Any]:
    """Flatten the extra containers, then apply the forbidden-field rule and the media policy
    (after flattening, so nothing can be smuggled in through a container)."""
    flat = flatten_extras(payload)
    policy.check_body(flat)
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
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
        ) from None


def parse_body(
    model: type[BaseModel], payload: dict[str, Any], policy: MediaPolicy, *, as_400: bool = False
) -> Any:
    """Flattening and the media policy (`prepare`), then the public schema (`validate`)."""
    return validate(model, prepare(payload, policy), as_400=as_400)
