"""Request rules that protect the server's filesystem (spec native-media.md §8).

- Forbidden fields (§8.3): requests never choose server paths. Scanned after flattening, at
  the top level, inside `diffusers_kwargs`, at any nesting depth, and inside string values
  that parse as JSON objects or arrays.
- Upload names (§8.4): no `/`, `\\`, NUL, and not `.` / `..`.
- Media references (§8.1, §8.2): remote URLs refused while a domain allowlist is set; local
  paths and file:// URLs must resolve inside `--allowed-local-media-path` when it is set.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from worldserve.errors import InvalidRequest

FORBIDDEN_FIELDS = frozenset({
    "output_path", "perf_dump_path", "model_path", "input_save_path", "prompt_file_path",
    "upscaling_model_path", "frame_interpolation_model_path", "lora_path", "vae_path",
    "transformer_weights_path", "component_paths",
})
MEDIA_FIELDS = frozenset({
    "input_reference", "reference_url", "image", "images", "image_path", "image_url", "url",
    "video", "video_path", "video_url", "first_frame", "intrinsics_path",
})
MAX_SCAN_DEPTH = 32


def is_forbidden_field(name: str) -> bool:
    return name in FORBIDDEN_FIELDS or name.endswith("_model_path")


def _decoded_json(value: str) -> Any:
    text = value.strip()
    if not text or text[0] not in "[{":
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def check_forbidden_fields(payload: Any, depth: int = 0) -> None:
    """Raise 400 `field '<name>' cannot be set by requests` for any forbidden key, anywhere."""
    if depth > MAX_SCAN_DEPTH:
        raise InvalidRequest("request body is nested too deeply")
    if isinstance(payload, dict):
        for key, value in payload.items():
            if isinstance(key, str) and is_forbidden_field(key):
                raise InvalidRequest(f"field '{key}' cannot be set by requests", param=key)
            check_forbidden_fields(value, depth + 1)
    elif isinstance(payload, list):
        for item in payload:
            check_forbidden_fields(item, depth + 1)
    elif isinstance(payload, str):
        decoded = _decoded_json(payload)
        if decoded is not None:
            check_forbidden_fields(decoded, depth + 1)


def check_upload_name(name: str | None, field: str = "image") -> None:
    if name is None:
        return
    if "/" in name:
        raise InvalidRequest("upload file name must not contain '/'", param=field)
    if "\\" in name or "\x00" in name or name in (".", ".."):
        raise InvalidRequest(f"upload file name {name!r} is not allowed (no '\\\\', NUL, '.' or "
                             "'..')", param=field)


def check_request_id(value: Any, field: str) -> None:
    if isinstance(value, str) and ("/" in value or "\\" in value or "\x00" in value
                                   or value in (".", "..")):
        raise InvalidRequest(f"{field} must not contain '/', '\\\\' or NUL", param=field)


class MediaPolicy:
    """Checks media references against the server's allowlists."""

    def __init__(self, allowed_local_media_path: Path | None, allowed_media_domains: list[str]) -> None:
        self.local_root = allowed_local_media_path.resolve() if allowed_local_media_path else None
        self.domains = [d.lower() for d in allowed_media_domains]

    def check_reference(self, value: str, field: str) -> str:
        """Validate one media reference; returns it (file:// rewritten to a plain path)."""
        lowered = value.strip().lower()
        if lowered.startswith("data:"):
            return value
        if lowered.startswith(("http://", "https://")):
            if self.domains:
                raise InvalidRequest("remote media URLs are not accepted on this route; send an "
                                     "upload or a data URL", param=field)
            return value
        if lowered.startswith("file:"):
            parsed = urlparse(value)
            if parsed.netloc not in ("", "localhost"):
                raise InvalidRequest("file:// URLs must have an empty or 'localhost' host",
                                     param=field)
            return self._local(unquote(parsed.path), field)
        return self._local(value, field) if self.local_root else value

    def _local(self, path: str, field: str) -> str:
        if self.local_root is None:
            return path
        resolved = Path(path).expanduser().resolve()
        if resolved != self.local_root and self.local_root not in resolved.parents:
            raise InvalidRequest("local media path is outside the allowed directory", param=field)
        return str(resolved)

    def scan(self, payload: Any, field: str = "", depth: int = 0) -> None:
        """Check every media reference in `payload` (media fields, *_path, *_url, URLs)."""
        if depth > MAX_SCAN_DEPTH:
            raise InvalidRequest("request body is nested too deeply")
        if isinstance(payload, dict):
            for key, value in payload.items():
                self.scan(value, str(key), depth + 1)
        elif isinstance(payload, list):
            for item in payload:
                self.scan(item, field, depth + 1)
        elif isinstance(payload, str):
            decoded = _decoded_json(payload)
            if decoded is not None:
                self.scan(decoded, field, depth + 1)
            elif _is_media_field(field) or payload.strip().lower().startswith(
                    ("http://", "https://", "file:")):
                self.check_reference(payload, field)


def _is_media_field(name: str) -> bool:
    return name in MEDIA_FIELDS or name.endswith("_path") or name.endswith("_url")
