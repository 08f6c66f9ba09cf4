"""Servers and helpers of the hostile-input suite (docs/hostile-input.md).

Two servers, shared by every module of this folder:
- `strict`: `--allowed-local-media-path <media>` and `--allowed-media-domain 127.0.0.1`
  (the test origin below), tiny Wan generation stage, fake reasoner, fake realtime.
- `bare`: no media options (local paths must be refused, loopback hosts too).
"""

from __future__ import annotations

import http.server
import io
import os
import threading
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from PIL import Image

from tests.support.server import ServerProcess


def png(size: tuple[int, int] = (32, 32), color: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, "PNG")
    return out.getvalue()


PNG = png()


class Origin(http.server.BaseHTTPRequestHandler):
    """A loopback media origin: images, redirects (allowed and forbidden), lies."""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 (stdlib name)
        port = self.server.server_address[1]
        routes = {
            "/img.png": lambda: self._send(200, PNG, "image/png"),
            "/to-img": lambda: self._redirect("/img.png"),
            "/to-localhost": lambda: self._redirect(f"http://localhost:{port}/img.png"),
            "/to-file": lambda: self._redirect("file:///etc/passwd"),
            "/text-as-image": lambda: self._send(200, b"definitely not an image", "image/png"),
            "/html": lambda: self._send(200, b"<html></html>", "text/html"),
            "/loop": lambda: self._redirect("/loop"),
        }
        routes.get(self.path.split("?")[0], lambda: self._send(404, b"", "text/plain"))()

    def _send(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _redirect(self, location: str) -> None:
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture(scope="package")
def origin() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Origin)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="package")
def media_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """<tmp>/media/ok.png (allowed), <tmp>/media/escape.png -> <tmp>/secret.png (outside)."""
    root = tmp_path_factory.mktemp("hostile-media")
    media = root / "media"
    media.mkdir()
    (media / "ok.png").write_bytes(PNG)
    (root / "secret.png").write_bytes(PNG)
    os.symlink(root / "secret.png", media / "escape.png")
    return media


@pytest.fixture(scope="package")
def gen_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.unit.generation.tiny_wan import build_tiny_wan

    return build_tiny_wan(tmp_path_factory.mktemp("hostile-wan") / "generation")


def server_config(workdir: Path, gen_model: Path) -> dict[str, Any]:
    stages: dict[str, Any] = {
        "generation": {"model_path": str(gen_model)},
        "reasoner": {"backend": "fake", "model_path": str(workdir)},
    }
    stages["realtime"] = {"enabled": True, "backend": "fake", "model_path": str(workdir)}
    return {"stages": stages}


def _start(workdir: Path, config: dict[str, Any], args: list[str]) -> ServerProcess:
    server = ServerProcess(workdir, config, args)
    try:
        server.wait_healthy(timeout_s=120)
    except Exception:
        server.stop()
        raise
    return server


@pytest.fixture(scope="package")
def strict(tmp_path_factory: pytest.TempPathFactory, gen_model: Path,
           media_dir: Path) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("strict")
    server = _start(workdir, server_config(workdir, gen_model),
                    ["--allowed-local-media-path", str(media_dir),
                     "--allowed-media-domain", "127.0.0.1"])
    yield server
    server.stop()


@pytest.fixture(scope="package")
def bare(tmp_path_factory: pytest.TempPathFactory, gen_model: Path) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("bare")
    server = _start(workdir, server_config(workdir, gen_model), [])
    yield server
    server.stop()


def model_name(server: ServerProcess, stage: str) -> str:
    models = httpx.get(server.base_url + "/v1/models", timeout=10).json()["data"]
    return next(m["id"] for m in models if m["stage"] == stage)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def assert_alive(server: ServerProcess) -> None:
    """No stage crashed and the server still answers /health with 200."""
    assert server.proc.poll() is None, server.log()[-3000:]
    response = httpx.get(server.base_url + "/health", timeout=10)
    assert response.status_code == 200, response.text
    assert "Traceback" not in response.text
