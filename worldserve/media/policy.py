"""The media policy: one type that says where request media may come from (docs/hostile-input.md).

Applies to every route (native media, chat completions, realtime `first_frame`):

- Forbidden fields (native-media §8.3): requests never choose server paths. Scanned after
  flattening, at any nesting depth, and inside string values that parse as JSON.
- Upload names (§8.4): no `/`, `\\`, NUL, `..`; stored names are the server's own ids.
- Local paths and `file://` URLs must resolve (symlinks followed) inside
  `--allowed-local-media-path`; without that option they are refused on every route (stricter
  than native-media §8.1, which reads server files when the option is absent).
- Remote `http(s)` URLs: with `--allowed-media-domain` only those hosts (exact, or a subdomain of
  a listed name; IP literals match exactly). worldserve fetches them itself (`media/fetch.py`),
  re-checking every redirect hop; hosts resolving to non-public addresses are refused unless
  listed explicitly. (Native-media §8.2 refuses remote URLs outright while an allowlist is set,
  because native SGLang fetches without hop checks; worldserve's own fetcher makes that moot.)
- Prompts are at most `MAX_PROMPT_CHARS` characters.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from worldserve.errors import InvalidRequest

if TYPE_CHECKING:
    from worldserve.config import ServerConfig

FORBIDDEN_FIELDS = frozenset(
    {
        "output_path",
        "perf_dump_path",
        "model_path",
        "input_save_path",
        "prompt_file_path",
        "upscaling_model_path",
        "frame_interpolation_model_path",
        "lora_path",
        "vae_path",
        "transformer_weights_path",
        "component_paths",
    }
)
MEDIA_FIELDS = frozenset(
    {
        "input_reference",
        "reference_url",
        "image",
        "images",
        "image_path",
        "image_url",
        "url",
        "video",
        "video_path",
        "video_url",
        "first_frame",
        "intrinsics_path",
    }
)
PROMPT_FIELDS = ("prompt", "negative_prompt", "task", "system_prompt", "question")
MAX_SCAN_DEPTH = 32
# Longest accepted prompt (characters). Text encoders of the served models read at most a few
# thousand tokens; 64 Ki characters leaves ample room and refuses megabyte prompts with a 400.
MAX_PROMPT_CHARS = 65_536

DEFAULT_MAX_BYTES = 32 * 1024 * 1024
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MAX_REDIRECTS = 5


def is_forbidden_field(name: str) -> bool:
    return name in FORBIDDEN_FIELDS or name.endswith("_model_path")


def decoded_json(value: str) -> Any:
    """The JSON object/array a string holds, or None (never raises, whatever the nesting)."""
    text = value.strip()
    if not text or text[0] not in "[{":
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _too_deep() -> InvalidRequest:
    return InvalidRequest(f"request body is nested too deeply (more than {MAX_SCAN_DEPTH} levels)")


def check_forbidden_fields(payload: Any, depth: int = 0) -> None:
    """Raise 400 `field '<name>' cannot be set by requests` for any forbidden key, anywhere."""
    if depth > MAX_SCAN_DEPTH:
        raise _too_deep()
    if isinstance(payload, dict):
        for key, value in payload.items():
            if isinstance(key, str) and is_forbidden_field(key):
                raise InvalidRequest(f"field '{key}' cannot be set by requests", param=key)
            check_forbidden_fields(value, depth + 1)
    elif isinstance(payload, list):
        for item in payload:
            check_forbidden_fields(item, depth + 1)
    elif isinstance(payload, str):
        decoded = decoded_json(payload)
        if decoded is not None:
            check_forbidden_fields(decoded, depth + 1)


def check_prompt_length(value: Any, field: str = "prompt") -> None:
    if isinstance(value, str) and len(value) > MAX_PROMPT_CHARS:
        raise InvalidRequest(
            f"{field} has {len(value)} characters; the limit is {MAX_PROMPT_CHARS}", param=field
        )


def check_prompt_lengths(payload: dict[str, Any]) -> None:
    """400 for any prompt-like field (top level, or in an action request's `input`) longer
    than `MAX_PROMPT_CHARS`."""
    for field in PROMPT_FIELDS:
        check_prompt_length(payload.get(field), field)
    inner = payload.get("input")
    if isinstance(inner, dict):
        for field in PROMPT_FIELDS:
            check_prompt_length(inner.get(field), f"input.{field}")


def check_upload_name(name: str | None, field: str = "image") -> None:
    if name is None:
        return
    if "/" in name:
        raise InvalidRequest("upload file name must not contain '/'", param=field)
    if "\\" in name or "\x00" in name or ".." in name or name == ".":
        raise InvalidRequest(
            f"upload file name {name!r} is not allowed (no '\\\\', NUL, '.' or '..')", param=field
        )


def check_request_id(value: Any, field: str) -> None:
    if isinstance(value, str) and (
        "/" in value or "\\" in value or "\x00" in value or ".." in value or value == "."
    ):
        raise InvalidRequest(f"{field} must not contain '/', '\\\\', '..' or NUL", param=field)


def is_remote_url(ref: str) -> bool:
    return ref[:8].lower().startswith(("http://", "https://"))


def is_local_reference(ref: str) -> bool:
    """Neither a data URL nor a remote URL: a plain path or a `file:` URL."""
    return not (ref[:5].lower() == "data:" or is_remote_url(ref))


def split_media_url(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an http(s) URL with a host, else 400 (never ValueError)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # bad IPv6 literal, non-numeric or out-of-range port
        raise InvalidRequest(f"media URL {url[:80]!r} is malformed: {exc}") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise InvalidRequest(f"media URL {url[:80]!r} must be http(s) with a host")
    if parts.username or parts.password:
        raise InvalidRequest("media URLs with credentials are not accepted")
    scheme = parts.scheme.lower()
    return scheme, parts.hostname, port or (443 if scheme == "https" else 80)


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def domain_allowed(host: str, domains: tuple[str, ...]) -> bool:
    """Exact host or a subdomain of a listed name (`cdn.example.com` matches `example.com`).

    IP literals match only exactly, as hosts and as listed names (`127.0.0.1` is not a
    "subdomain" of `0.0.1`, nor is the name `10.127.0.0.1` one of `127.0.0.1`)."""
    host = host.lower().rstrip(".")
    if _is_ip_literal(host):
        return host in domains
    return any(host == d or (host.endswith("." + d) and not _is_ip_literal(d)) for d in domains)


@dataclass(frozen=True)
class MediaPolicy:
    """Where request media may come from; built once from the server config."""

    allowed_local_dir: Path | None = None
    allowed_domains: tuple[str, ...] = ()
    max_bytes: int = DEFAULT_MAX_BYTES
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_redirects: int = DEFAULT_MAX_REDIRECTS

    @classmethod
    def from_config(cls, config: ServerConfig) -> "MediaPolicy":
        local = config.allowed_local_media_path
        return cls(
            allowed_local_dir=local.resolve() if local else None,
            allowed_domains=tuple(d.lower().rstrip(".") for d in config.allowed_media_domains),
            max_bytes=config.max_upload_bytes,
        )

    def explicitly_listed(self, host: str) -> bool:
        return host.lower().rstrip(".") in self.allowed_domains

    def check_host(self, host: str, field: str | None = None) -> None:
        if self.allowed_domains and not domain_allowed(host, self.allowed_domains):
            raise InvalidRequest(
                f"media host {host!r} is not in the allowed media domains", param=field
            )

    def local_path(self, ref: str, field: str | None = None, must_exist: bool = True) -> Path:
        """A plain path or `file://` URL that resolves inside the allowed directory."""
        if self.allowed_local_dir is None:
            raise InvalidRequest(
                "local media paths are not accepted on this server; send an "
                "upload or a data URL (operators: --allowed-local-media-path DIR)",
                param=field,
            )
        raw = ref
        if ref[:5].lower() == "file:":
            parts = urlsplit(ref)
            if parts.netloc not in ("", "localhost"):
                raise InvalidRequest(
                    f"file URL host must be empty or localhost, got {parts.netloc!r}", param=field
                )
            raw = unquote(parts.path)
        if "\0" in raw:
            raise InvalidRequest("local media path contains a NUL byte", param=field)
        try:
            resolved = Path(raw).expanduser().resolve()
        except (OSError, RuntimeError, ValueError):  # symlink loops, unknown ~user
            raise InvalidRequest("local media path cannot be resolved", param=field) from None
        if not resolved.is_relative_to(self.allowed_local_dir):
            raise InvalidRequest("local media path is outside the allowed directory", param=field)
        if must_exist and not _is_file(resolved):
            raise InvalidRequest(f"local media file {raw!r} does not exist", param=field)
        return resolved

    def check_reference(self, value: str, field: str) -> str:
        """Validate one media reference without I/O beyond path resolution; returns it with a
        local path or `file://` URL rewritten to the resolved plain path."""
        if value[:5].lower() == "data:":
            return value
        if is_remote_url(value):
            _, host, _ = split_media_url(value.strip())
            self.check_host(host, field)
            return value
        return str(self.local_path(value, field))

    def check_body(self, payload: dict[str, Any]) -> None:
        """Every rule of this page on a flattened request body: forbidden fields, prompt
        lengths, then each media reference (`scan`)."""
        check_forbidden_fields(payload)
        check_prompt_lengths(payload)
        self.scan(payload)

    def scan(self, payload: Any, field: str = "", depth: int = 0) -> None:
        """Check every media reference in `payload` (media fields, *_path, *_url, URLs),
        including strings that hold JSON objects or arrays."""
        if depth > MAX_SCAN_DEPTH:
            raise _too_deep()
        if isinstance(payload, dict):
            for key, value in payload.items():
                self.scan(value, str(key), depth + 1)
        elif isinstance(payload, list):
            for item in payload:
                self.scan(item, field, depth + 1)
        elif isinstance(payload, str):
            decoded = decoded_json(payload)
            if decoded is not None:
                self.scan(decoded, field, depth + 1)
            elif _looks_like_reference(field, payload):
                self.check_reference(payload, field)


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # name too long and other oddities: not a readable file
        return False


def _looks_like_reference(field: str, value: str) -> bool:
    if value.strip().lower().startswith(("http://", "https://", "file:")):
        return True
    media_field = field in MEDIA_FIELDS or field.endswith("_path") or field.endswith("_url")
    return media_field and bool(value.strip())
