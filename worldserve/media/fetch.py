"""Fetching media references under the media policy (`worldserve.media.policy.MediaPolicy`).

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
import ipaddress
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urljoin, urlsplit, urlunsplit

import httpx

from worldserve.errors import InvalidRequest, PayloadTooLarge
from worldserve.media.data_url import decode_data_url
from worldserve.media.policy import (  # noqa: F401 (re-exported: one policy type, one place)
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_REDIRECTS,
    DEFAULT_TIMEOUT_S,
    MediaPolicy,
    domain_allowed,
    is_remote_url,
    split_media_url,
)

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


class FetchFailed(InvalidRequest):
    """A remote fetch failed (400); `retryable` for 429 / 5xx / network errors."""

    def __init__(self, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True)
class Fetched:
    data: bytes
    content_type: str


def check_local_path(ref: str, policy: MediaPolicy) -> Path:
    """A plain path or `file://` URL that resolves inside the allowed directory."""
    return policy.local_path(ref)


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


async def _checked_address(host: str, port: int, policy: MediaPolicy) -> str:
    """Resolve once; refuse non-public addresses unless the host is listed explicitly."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):  # gaierror, or an IDNA-invalid name
        raise FetchFailed(f"media host {host!r} cannot be resolved") from None
    addresses = [info[4][0] for info in infos]
    if not addresses:
        raise FetchFailed(f"media host {host!r} cannot be resolved")
    if not policy.explicitly_listed(host) and not all(_public(a) for a in addresses):
        raise InvalidRequest(f"media host {host!r} resolves to a non-public address; "
                             "list it with --allowed-media-domain to allow it")
    return addresses[0]


def _check_url(url: str, policy: MediaPolicy) -> tuple[str, str, int]:
    scheme, host, port = split_media_url(url)
    policy.check_host(host)
    return scheme, host, port


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


async def _fetch_hops(url: str, policy: MediaPolicy, client: httpx.AsyncClient) -> Fetched:
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
                status = response.status_code
                raise FetchFailed(f"fetching media from {host!r} failed with HTTP {status}",
                                  retryable=status == 429 or status >= 500)
            data = await _read_capped(response, policy.max_bytes)
            return Fetched(data, response.headers.get("content-type", "").lower())
        finally:
            await response.aclose()
    raise InvalidRequest(f"media URL redirected more than {policy.max_redirects} times")


async def fetch_media(url: str, policy: MediaPolicy) -> Fetched:
    """GET a remote media URL under the policy (every hop checked, bytes and time bounded);
    returns the bytes and the declared content type."""
    async with httpx.AsyncClient(follow_redirects=False, trust_env=False,
                                 timeout=policy.timeout_s) as client:
        try:
            async with asyncio.timeout(policy.timeout_s):
                return await _fetch_hops(url, policy, client)
        except TimeoutError:
            raise FetchFailed(f"fetching media timed out after {policy.timeout_s:g} s",
                              retryable=True) from None
        except httpx.HTTPError as exc:
            raise FetchFailed(f"fetching media failed: {type(exc).__name__}",
                              retryable=True) from None


async def fetch_remote(url: str, policy: MediaPolicy) -> bytes:
    """The bytes of a remote media URL (see `fetch_media`)."""
    return (await fetch_media(url, policy)).data


async def load_media(ref: str, policy: MediaPolicy, field: str = "url") -> bytes:
    """Bytes of any media reference: data URL, http(s) URL, file URL or local path."""
    if ref[:5].lower() == "data:":
        return decode_data_url(ref, field=field, max_bytes=policy.max_bytes)[1]
    if is_remote_url(ref):
        return await fetch_remote(ref, policy)
    return await read_local(policy.local_path(ref), policy.max_bytes)


async def read_local(path: Path, max_bytes: int) -> bytes:
    """A checked local file's bytes, refusing files above `max_bytes` without reading them."""
    try:
        if path.stat().st_size > max_bytes:
            raise PayloadTooLarge(f"local media file exceeds the {max_bytes}-byte limit")
        return await asyncio.to_thread(path.read_bytes)
    except OSError as exc:
        raise InvalidRequest(f"cannot read local media file: {exc.strerror}") from None
