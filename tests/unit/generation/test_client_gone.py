"""A client that closes its connection mid-body (the fault soak's vanishing uploads, issue 34):
not a server error. It was a 500 with an ERROR traceback ("unhandled error on POST /v1/videos",
starlette's ClientDisconnect) and uvicorn's "Exception in ASGI application"."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from worldserve.api.app import create_app
from worldserve.api.runtime import ServerRuntime
from worldserve.config import GenerationStageConfig, ServerConfig
from worldserve.engines.generation.engine import GenerationEngine
from worldserve.runtime.inprocess import InProcessStageClient


@pytest.fixture(scope="module")
def engine(tiny_wan_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> GenerationEngine:
    cfg = GenerationStageConfig(model_path=tiny_wan_dir, output_dir=tmp_path_factory.mktemp("o"))
    return GenerationEngine(cfg, ServerConfig())


async def post_then_vanish(engine: GenerationEngine, path: str,
                           content_type: str) -> list[dict[str, Any]]:
    """POST `path` declaring 4 MB, send 1 KB, disconnect; the messages the app sent back."""
    config = ServerConfig.model_validate({"stages": {
        "generation": {"model_path": engine.model_path, "output_dir": str(engine.output_dir)},
        "reasoner": {"enabled": False}}})
    app = create_app(ServerRuntime(config=config, clients={
        "generation": InProcessStageClient("generation", engine)}))
    incoming = [{"type": "http.request", "body": b'{"prompt": "' + b"x" * 1024,
                 "more_body": True}, {"type": "http.disconnect"}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "server": ("127.0.0.1", 8000),
             "client": ("127.0.0.1", 40000),
             "headers": [(b"host", b"test"), (b"content-type", content_type.encode()),
                         (b"content-length", str(4 * 2**20).encode())]}
    await app(scope, receive, send)
    return sent


@pytest.mark.parametrize("path, content_type", [
    ("/v1/videos", "application/json"),
    ("/v1/images/generations", "application/json"),
    ("/v1/images/edits", "multipart/form-data; boundary=b"),
])
async def test_a_body_cut_by_the_client_is_no_server_error(
        engine: GenerationEngine, path: str, content_type: str,
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        sent = await post_then_vanish(engine, path, content_type)
    statuses = [m["status"] for m in sent if m["type"] == "http.response.start"]
    assert statuses and all(s < 500 for s in statuses), statuses
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
