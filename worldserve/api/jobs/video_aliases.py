"""Other servers' names for a video job's inputs, mapped onto `/v1/videos`' own before the one
pass reads the request (api/jobs/inputs.py):

- `image_reference` (vLLM-Omni, TensorRT-LLM): a multipart file is an `input_reference` file; a
  JSON string or `{"image_url": ...}` is an `input_reference` reference (URL, data URL or an
  allowed path, under the media rules); `{"file_id": ...}` is a 400 (no files API here).
- `video_reference` as a JSON string: a `video_url` reference (the multipart file is read as
  `video_reference` already).
- `output_format` (TensorRT-LLM): which body `/v1/videos/sync` answers (`mp4` or
  `safetensors`); `format` in the query says the same and wins.

Giving an alias and the field it maps to is a 400 naming both; an error about the mapped
field names the alias the client sent (`named_as`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from worldserve.api.jobs.inputs import FormBody, flatten_extras
from worldserve.errors import InvalidRequest

SYNC_FORMATS = ("mp4", "safetensors")


def _take(fields: dict[str, Any], alias: str, target: str, value: Any) -> None:
    if fields.get(target):
        raise InvalidRequest(f"give {alias} or {target}, not both", param=alias)
    fields[target] = value


def _image_reference(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and set(value) == {"image_url"} and isinstance(
            value["image_url"], str):
        return value["image_url"]
    if isinstance(value, dict) and "file_id" in value:
        raise InvalidRequest("image_reference.file_id: this server has no files API; give "
                             "image_reference.image_url (a URL or data URL) or upload the "
                             "image as a multipart file", param="image_reference")
    raise InvalidRequest('image_reference must be a URL string or {"image_url": "..."}',
                         param="image_reference")


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
              _image_reference(fields.pop("image_reference")))
        renamed["input_reference"] = "image_reference"
    if isinstance(fields.get("video_reference"), str):
        _take(fields, "video_reference", "video_url", fields.pop("video_reference"))
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


def sync_format(query_format: str | None, fields: dict[str, Any]) -> str:
    """The body `/v1/videos/sync` answers: `format` in the query, else `output_format`."""
    if query_format is not None:
        if query_format not in SYNC_FORMATS:
            raise InvalidRequest(f"format must be one of {', '.join(SYNC_FORMATS)} "
                                 f"(got {query_format[:32]!r})", param="format")
        return query_format
    value = flatten_extras(fields).get("output_format")
    return value if value in SYNC_FORMATS else "mp4"  # other values: the schema's 400


def refuse_tensor_format(fields: dict[str, Any]) -> None:
    """An asynchronous job always answers an MP4 at /content: `safetensors` is a sync body."""
    if flatten_extras(fields).get("output_format") == "safetensors":
        raise InvalidRequest("output_format 'safetensors' is an answer of POST "
                             "/v1/videos/sync; a job's /content is its MP4",
                             param="output_format")
