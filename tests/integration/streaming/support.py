"""Helpers of the live-reasoning integration tests: servers with the fake backend, images."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import httpx
from PIL import Image

from tests.support.server import ServerProcess

SESSION_BODY = {"system_prompt": "Describe each frame in one short sentence.",
                "question": "What is happening in this feed?"}


def fake_config(workdir: Path, **reasoner: Any) -> dict[str, Any]:
    """A server with only the reasoner stage, on the fake backend."""
    streaming = reasoner.pop("streaming", {})
    return {"stages": {"generation": {"enabled": False},
                       "reasoner": {"backend": "fake", "model_path": str(workdir),
                                    "streaming": streaming, **reasoner}}}


def start_server(workdir: Path, config: dict[str, Any],
                 env: dict[str, str] | None = None) -> ServerProcess:
    server = ServerProcess(workdir, config, env=env)
    try:
        server.wait_healthy(timeout_s=60)
    except Exception:
        server.stop()
        raise
    return server


def image_bytes(fmt: str = "JPEG", size: tuple[int, int] = (64, 48), seed: int = 0) -> bytes:
    img = Image.new("RGB", size, ((seed * 37) % 256, (seed * 91) % 256, 128))
    out = io.BytesIO()
    img.save(out, format=fmt)
    return out.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def nim_error(response: httpx.Response, status: int) -> str:
    """Assert the NIM envelope with `status` (streaming-reasoning §9's message and code, plus the
    OpenAI shape's type and param: docs/security.md); return the message."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["code"] == status
    return body["error"]["message"]


class Sessions:
    """Creates REST sessions and deletes whatever is left at the end of a test."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client
        self.ids: list[str] = []

    def create(self, **overrides: Any) -> httpx.Response:
        response = self.client.post("/v1/streaming/sessions", json={**SESSION_BODY, **overrides})
        if response.status_code == 201:
            self.ids.append(response.json()["session_id"])
        return response

    def new(self, **overrides: Any) -> str:
        response = self.create(**overrides)
        assert response.status_code == 201, response.text
        return response.json()["session_id"]

    def frame(self, session_id: str, data: bytes | None = None, **kwargs: Any) -> httpx.Response:
        if data is not None:
            kwargs.setdefault("content", data)
            kwargs.setdefault("headers", {"content-type": "image/jpeg"})
        return self.client.post(f"/v1/streaming/sessions/{session_id}/frame", **kwargs)

    def delete(self, session_id: str) -> httpx.Response:
        return self.client.delete(f"/v1/streaming/sessions/{session_id}")

    def cleanup(self) -> None:
        for session_id in self.ids:
            self.delete(session_id)
