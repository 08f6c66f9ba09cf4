"""The media fetcher against real local HTTP servers (loopback only)."""

from __future__ import annotations

import base64
import http.server
import os
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from worldserve.errors import InvalidRequest, PayloadTooLarge
from worldserve.media.data_url import decode_data_url
from worldserve.media.fetch import (
    MediaPolicy,
    check_local_path,
    domain_allowed,
    fetch_remote,
    load_media,
)

BODY = b"\x89PNG\r\n\x1a\n" + b"x" * 100


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 (stdlib name)
        port = self.server.server_address[1]
        routes = {
            "/img": lambda: self._send(200, BODY),
            "/to-localhost": lambda: self._redirect(f"http://localhost:{port}/img"),
            "/to-img": lambda: self._redirect("/img"),
            "/loop": lambda: self._redirect("/loop"),
            "/big": lambda: self._send(200, b"y" * 5000),
            "/missing": lambda: self._send(404, b"no"),
            "/slow": self._slow,
        }
        routes.get(self.path, lambda: self._send(404, b""))()

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _redirect(self, location: str) -> None:
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _slow(self) -> None:
        time.sleep(2)
        try:
            self._send(200, BODY)
        except BrokenPipeError:  # the client gave up first, as the test intends
            pass


@pytest.fixture(scope="module")
def origin() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


LISTED = MediaPolicy(allowed_domains=("127.0.0.1",), max_bytes=1000, timeout_s=1.0)


async def test_listed_loopback_host_is_fetched(origin: str) -> None:
    assert await fetch_remote(f"{origin}/img", LISTED) == BODY
    assert await fetch_remote(f"{origin}/to-img", LISTED) == BODY  # same-host redirect


async def test_every_redirect_hop_is_checked(origin: str) -> None:
    with pytest.raises(InvalidRequest, match="'localhost' is not in the allowed media domains"):
        await fetch_remote(f"{origin}/to-localhost", LISTED)


async def test_unlisted_host_resolving_to_loopback_is_refused(origin: str) -> None:
    port = origin.rsplit(":", 1)[1]
    with pytest.raises(InvalidRequest, match="non-public address"):
        await fetch_remote(f"http://localhost:{port}/img", MediaPolicy())
    with pytest.raises(InvalidRequest, match="non-public address"):
        await fetch_remote(f"{origin}/img", MediaPolicy())


@pytest.mark.parametrize("url", ["http://10.0.0.1/x", "http://169.254.169.254/latest",
                                 "http://[::1]/x", "http://0.0.0.0/x"])
async def test_private_and_link_local_literals_are_refused(url: str) -> None:
    with pytest.raises(InvalidRequest, match="non-public address"):
        await fetch_remote(url, MediaPolicy(timeout_s=1))


async def test_bounds_on_bytes_redirects_time_and_status(origin: str) -> None:
    with pytest.raises(PayloadTooLarge):
        await fetch_remote(f"{origin}/big", LISTED)
    with pytest.raises(InvalidRequest, match="redirected more than 5 times"):
        await fetch_remote(f"{origin}/loop", LISTED)
    with pytest.raises(InvalidRequest, match="timed out"):
        await fetch_remote(f"{origin}/slow", LISTED)
    with pytest.raises(InvalidRequest, match="HTTP 404"):
        await fetch_remote(f"{origin}/missing", LISTED)


@pytest.mark.parametrize("url", ["ftp://example.com/a.png", "http://user:pw@example.com/a.png",
                                 "http:///nohost"])
async def test_bad_urls(url: str) -> None:
    with pytest.raises(InvalidRequest):
        await fetch_remote(url, MediaPolicy())


def test_domain_matching() -> None:
    assert domain_allowed("example.com", ("example.com",))
    assert domain_allowed("cdn.Example.com.", ("example.com",))
    assert not domain_allowed("badexample.com", ("example.com",))
    assert not domain_allowed("example.com.evil.org", ("example.com",))


def test_data_urls() -> None:
    url = "data:image/png;base64," + base64.b64encode(BODY).decode()
    assert decode_data_url(url, max_bytes=1000) == ("image/png", BODY)
    assert decode_data_url("data:,a%20b") == ("text/plain", b"a b")
    with pytest.raises(InvalidRequest, match="^image: the data URL payload is not valid base64"):
        decode_data_url("data:image/png;base64,@@@", field="image", max_bytes=1000)
    with pytest.raises(PayloadTooLarge):
        decode_data_url("data:image/png;base64," + "A" * 4000, max_bytes=1000)
    with pytest.raises(InvalidRequest, match="malformed"):
        decode_data_url("data:image/png;base64", max_bytes=1000)
    with pytest.raises(InvalidRequest, match="must be base64") as caught:
        decode_data_url("data:image/png,abc", field="image_url", base64_only=True)
    assert caught.value.param == "image_url"


@pytest.fixture
def media_root(tmp_path: Path) -> Path:
    root = tmp_path / "media"
    root.mkdir()
    (root / "ok.png").write_bytes(BODY)
    (tmp_path / "secret.png").write_bytes(b"secret")
    os.symlink(tmp_path / "secret.png", root / "escape.png")
    return root


def test_local_paths_must_stay_inside_the_allowed_dir(media_root: Path) -> None:
    policy = MediaPolicy(allowed_local_dir=media_root.resolve())
    assert check_local_path(str(media_root / "ok.png"), policy) == (media_root / "ok.png").resolve()
    assert check_local_path(f"file://{media_root}/ok.png", policy).name == "ok.png"
    assert check_local_path(f"file://localhost{media_root}/ok.png", policy).name == "ok.png"
    for bad in (str(media_root / "escape.png"), str(media_root / ".." / "secret.png"),
                f"file://{media_root}/../secret.png", "/etc/passwd"):
        with pytest.raises(InvalidRequest, match="outside the allowed directory"):
            check_local_path(bad, policy)
    with pytest.raises(InvalidRequest, match="host must be empty or localhost"):
        check_local_path(f"file://evil.com{media_root}/ok.png", policy)
    with pytest.raises(InvalidRequest, match="does not exist"):
        check_local_path(str(media_root / "nope.png"), policy)


def test_local_paths_are_refused_without_the_option(media_root: Path) -> None:
    with pytest.raises(InvalidRequest, match="--allowed-local-media-path"):
        check_local_path(str(media_root / "ok.png"), MediaPolicy())


async def test_load_media_dispatches(origin: str, media_root: Path) -> None:
    policy = MediaPolicy(allowed_local_dir=media_root.resolve(), allowed_domains=("127.0.0.1",))
    data_url = "data:image/png;base64," + base64.b64encode(BODY).decode()
    assert await load_media(data_url, policy) == BODY
    assert await load_media(f"{origin}/img", policy) == BODY
    assert await load_media(str(media_root / "ok.png"), policy) == BODY


async def test_download_failures_name_the_kind_of_reference(origin: str) -> None:
    from worldserve.media.uploads import read_image_reference, read_video_reference

    with pytest.raises(InvalidRequest, match=r"Failed to process video source: input_video: .*404"):
        await read_video_reference(f"{origin}/missing.mp4", "input_video", 1000, LISTED)
    with pytest.raises(InvalidRequest, match=r"Failed to process image source: image: .*404"):
        await read_image_reference(f"{origin}/missing", "image", 1000, LISTED)
