"""Media references in requests: data URLs, local paths and remote URLs, under one policy.

- `data:` URLs are decoded within the byte limit.
- Local paths and `file://` URLs must resolve (symlinks followed) inside
  `--allowed-local-media-path`; without that option they are refused.
- Remote `http(s)` URLs are fetched by worldserve itself, hop by hop: every redirect target is
  checked again; with `--allowed-media-domain` only those hosts (exact or subdomain) are allowed;
  hosts that resolve to loopback, private, link-local or otherwise non-public addresses are refused
  unless the host is listed explicitly. The connection goes to the address that was checked (no
  second DNS lookup, so a rebinding resolver cannot swap it). Bytes, time and redirects are bounded.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit

import httpx

from worldserve.config import ServerConfig
from worldserve.errors import InvalidRequest, PayloadTooLarge

DEFAULT_MAX_BYTES = 32 * 1024 * 1024
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MAX_REDIRECTS = 5
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


@dataclass(frozen=True)
class MediaPolicy:
    """Where media may come from; built once from the server config."""

    allowed_local_dir: Path | None = None
    allowed_domains: tuple[str, ...] = ()
    max_bytes: int = DEFAULT_MAX_BYTES
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_redirects: int = DEFAULT_MAX_REDIRECTS

    @classmethod
    def from_config(cls, config: ServerConfig) -> "MediaPolicy":
        local = config.allowed_local_media_path
        return cls(allowed_local_dir=local.resolve() if local else None,
                   allowed_domains=tuple(config.allowed_media_domains),
                   max_bytes=config.max_upload_bytes)


def is_remote_url(ref: str) -> bool:
    return ref[:8].lower().startswith(("http://", "https://"))


def domain_allowed(host: str, domains: tuple[str, ...]) -> bool:
    """Exact host or a subdomain of a listed domain (`cdn.example.com` matches `example.com`)."""
    host = host.lower().rstrip(".")
    return any(host == d or host.endswith("." + d) for d in domains)


def decode_data_url(url: str, max_bytes: int) -> tuple[str, bytes]:
    """`data:<mime>;base64,<payload>` -> (mime, bytes)."""
    header, sep, payload = url.partition(",")
    if not sep or not header.lower().startswith("data:"):
        raise InvalidRequest("malformed data URL: expected 'data:<type>;base64,<payload>'")
    mime, _, params = header[5:].partition(";")
    if max(0, len(payload) * 3 // 4 - 2) > max_bytes:
        raise PayloadTooLarge(f"data URL payload exceeds the {max_bytes}-byte limit")
    if "base64" not in params.lower().split(";"):
        return mime or "text/plain", unquote(payload).encode()
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest("data URL payload is not valid base64") from None
    return mime or "application/octet-stream", data


def check_local_path(ref: str, policy: MediaPolicy) -> Path:
    """A plain path or `file://` URL that resolves inside the allowed directory."""
    if policy.allowed_local_dir is None:
        raise InvalidRequest("local media paths are not accepted on this server; send an upload "
                             "or a data URL (operators: --allowed-local-media-path DIR)")
    raw = ref
    if ref.lower().startswith("file:"):
        parts = urlsplit(ref)
        if parts.netloc not in ("", "localhost"):
            raise InvalidRequest(f"file URL host must be empty or localhost, got {parts.netloc!r}")
        raw = unquote(parts.path)
    if "\0" in raw:
        raise InvalidRequest("local media path contains a NUL byte")
    resolved = Path(raw).expanduser().resolve()
    if not resolved.is_relative_to(policy.allowed_local_dir):
        raise InvalidRequest("local media path is outside the allowed directory")
    if not resolved.is_file():
        raise InvalidRequest(f"local media file {raw!r} does not exist")
    return resolved


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


async def _checked_address(host: str, port: int, policy: MediaPolicy) -> str:
    """Resolve once; refuse non-public addresses unless the host is listed explicitly."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        raise InvalidRequest(f"media host {host!r} cannot be resolved") from None
    addresses = [info[4][0] for info in infos]
    explicitly_listed = host.lower().rstrip(".") in policy.allowed_domains
    if not explicitly_listed and not all(_public(a) for a in addresses):
        raise InvalidRequest(f"media host {host!r} resolves to a non-public address; "
                             "list it with --allowed-media-domain to allow it")
    return addresses[0]


def _check_url(url: str, policy: MediaPolicy) -> tuple[str, str, int]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRequest(f"media URL {url!r} must be http(s) with a host")
    if parts.username or parts.password:
        raise InvalidRequest("media URLs with credentials are not accepted")
    host = parts.hostname
    if policy.allowed_domains and not domain_allowed(host, policy.allowed_domains):
        raise InvalidRequest(f"media host {host!r} is not in the allowed media domains")
    return parts.scheme, host, parts.port or (443 if parts.scheme == "https" else 80)


def _pinned(url: str, address: str) -> str:
    parts = urlsplit(url)
    netloc = f"[{address}]" if ":" in address else address
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))


async def _read_capped(response: httpx.Response, max_bytes: int) -> bytes:
    declared = response.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(f"remote media is larger than the {max_bytes}-byte limit")
    chunks, total = [], 0
    async for chunk in response.aiter_bytes():
        total += len(chunk)
        if total > max_bytes:
            raise PayloadTooLarge(f"remote media is larger than the {max_bytes}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


async def _fetch_hops(url: str, policy: MediaPolicy, client: httpx.AsyncClient) -> bytes:
    for _ in range(policy.max_redirects + 1):
        scheme, host, port = _check_url(url, policy)
        address = await _checked_address(host, port, policy)
        headers = {"Host": urlsplit(url).netloc.rsplit("@", 1)[-1]}
        extensions = {"sni_hostname": host} if scheme == "https" else {}
        request = client.build_request("GET", _pinned(url, address), headers=headers,
                                       extensions=extensions)
        response = await client.send(request, stream=True)
        try:
            if response.status_code in REDIRECT_STATUSES and "location" in response.headers:
                url = urljoin(url, response.headers["location"])
                continue
            if response.status_code != 200:
                raise InvalidRequest(f"fetching media from {host!r} failed with HTTP "
                                     f"{response.status_code}")
            return await _read_capped(response, policy.max_bytes)
        finally:
            await response.aclose()
    raise InvalidRequest(f"media URL redirected more than {policy.max_redirects} times")


async def fetch_remote(url: str, policy: MediaPolicy) -> bytes:
    """GET a remote media URL under the policy (every hop checked, bytes and time bounded)."""
    async with httpx.AsyncClient(follow_redirects=False, trust_env=False,
                                 timeout=policy.timeout_s) as client:
        try:
            async with asyncio.timeout(policy.timeout_s):
                return await _fetch_hops(url, policy, client)
        except TimeoutError:
            raise InvalidRequest(f"fetching media timed out after {policy.timeout_s:g} s") from None
        except httpx.HTTPError as exc:
            raise InvalidRequest(f"fetching media failed: {type(exc).__name__}") from None


async def load_media(ref: str, policy: MediaPolicy) -> bytes:
    """Bytes of any media reference: data URL, http(s) URL, file URL or local path."""
    if ref[:5].lower() == "data:":
        return decode_data_url(ref, policy.max_bytes)[1]
    if is_remote_url(ref):
        return await fetch_remote(ref, policy)
    path = check_local_path(ref, policy)
    if path.stat().st_size > policy.max_bytes:
        raise PayloadTooLarge(f"local media file exceeds the {policy.max_bytes}-byte limit")
    return await asyncio.to_thread(path.read_bytes)
