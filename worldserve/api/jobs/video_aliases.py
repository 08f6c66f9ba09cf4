"""Other servers' names for a video job's inputs, mapped onto `/v1/videos`' own before the one
pass reads the request (api/jobs/inputs.py). The shapes are TensorRT-LLM's visual-gen
`VideoGenerationRequest` (tensorrt_llm/serve/openai_protocol.py) and vLLM-Omni's:

- `image_reference`: a multipart file is an `input_reference` file; a JSON string (URL, data URI
  or `file://` path), `{"image_url": ...}` (vLLM-Omni) or `{"content": ..., "role": ...}`
  (TensorRT-LLM: base64 bytes or a data URI; role `reference` / `first_frame`) is an
  `input_reference` reference, read under the media rules; `{"file_id": ...}` is a 400 (no files
  API here).
- `video_reference`: the same shapes as a `video_url` reference (the multipart file is read as
  `video_reference` already).
- `format` (TensorRT-LLM): which body `/v1/videos/sync` answers: `mp4` / `auto` (the MP4) or
  `safetensors` (the tensors); `format` in the query says the same and wins.

One reference per field (a list of one is taken); an alias given with the field it maps to is
a 400 naming both; an error about the mapped field names the alias the client sent
(`named_as`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from worldserve.api.jobs.inputs import FormBody
from worldserve.errors import InvalidRequest

ROLES = ("reference", "first_frame")  # TensorRT-LLM's roles a first-frame condition takes


def _take(fields: dict[str, Any], alias: str, target: str, value: Any) -> None:
    if fields.get(target):
        raise InvalidRequest(f"give {alias} or {target}, not both", param=alias)
    fields[target] = value


def _one(value: Any, name: str) -> Any:
    if isinstance(value, list):
        if len(value) != 1:
            raise InvalidRequest(f"{name}: this server conditions on one reference (got "
                                 f"{len(value)})", param=name)
        return value[0]
    return value


def _reference(value: Any, name: str) -> str:
    """A reference as the media rules read it: URL, data URL or a local path."""
    value = _one(value, name)
    if isinstance(value, str):
        return value.removeprefix("file://")
    if isinstance(value, dict) and set(value) == {"image_url"} and isinstance(
            value["image_url"], str):
        return value["image_url"]
    if isinstance(value, dict) and "file_id" in value:
        raise InvalidRequest(f"{name}.file_id: this server has no files API; give a URL, a "
                             "data URI or upload the file", param=name)
    if isinstance(value, dict) and isinstance(value.get("content"), str) and \
            set(value) <= {"content", "role"}:
        if value.get("role") not in (None, *ROLES):
            raise InvalidRequest(f"{name}.role {value['role']!r} is not available: the "
                                 f"reference conditions the first frame ({', '.join(ROLES)})",
                                 param=name)
        content = value["content"]
        return content if content.startswith("data:") else f"data:;base64,{content}"
    raise InvalidRequest(f'{name} must be a URL, a data URI, {{"content": ...}} or '
                         '{"image_url": ...}', param=name)


def map_aliases(body: FormBody) -> dict[str, str]:
    """Rename the aliases above in `body` to worldserve's fields (in place); returns
    {worldserve's field: the alias it came from}."""
    fields, files = body.fields, body.files
    renamed: dict[str, str] = {}
    if "image_reference" in files:
        if "input_reference" in files or fields.get("input_reference"):
            raise InvalidRequest("give image_reference or input_reference, not both",
                                 param="image_reference")
        files["input_reference"] = files.pop("image_reference")
        renamed["input_reference"] = "image_reference"
    if "image_reference" in fields:
        _take(fields, "image_reference", "input_reference",
              _reference(fields.pop("image_reference"), "image_reference"))
        renamed["input_reference"] = "image_reference"
    if fields.get("video_reference") is not None:
        _take(fields, "video_reference", "video_url",
              _reference(fields.pop("video_reference"), "video_reference"))
        renamed["video_url"] = "video_reference"
    return renamed


@contextlib.contextmanager
def named_as(renamed: dict[str, str]) -> Iterator[None]:
    """A 400 about a mapped field names the alias the client sent."""
    try:
        yield
    except InvalidRequest as exc:
        alias = renamed.get(exc.param or "")
        if alias is None:
            raise
        raise InvalidRequest(f"{alias}: {exc.message}", param=alias) from None


def answer_format(fields: dict[str, Any], query_format: str | None, sync: bool) -> str:
    """The body the answer takes: `format` in the query, else TensorRT-LLM's body field
    `format` (removed from `fields`); `mp4` or `safetensors`. A job's `/content` is its MP4,
    so `safetensors` is for `/v1/videos/sync` only."""
    body_format = fields.pop("format", None)
    chosen = query_format if query_format is not None else body_format
    if chosen is None or chosen in ("mp4", "auto"):
        return "mp4"
    if chosen != "safetensors":
        raise InvalidRequest(f"format must be one of mp4, auto, safetensors (got "
                             f"{str(chosen)[:32]!r})", param="format")
    if not sync:
        raise InvalidRequest("format 'safetensors' is an answer of POST /v1/videos/sync; a "
                             "job's /content is its MP4", param="format")
    return chosen
