"""Media references on every route, table-driven: expected status for each hostile case.

`strict` allows <media> and the 127.0.0.1 origin; `bare` allows neither (docs/hostile-input.md).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

from tests.integration.hostile.conftest import PNG, assert_alive, model_name
from tests.support.server import ServerProcess

DATA_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()
EDIT = {"prompt": "x", "size": "64x64", "num_inference_steps": "1"}


@dataclass
class Ctx:
    origin: str
    media: Path
    chat_model: str

    @property
    def secret(self) -> str:
        return str(self.media / ".." / "secret.png")

    @property
    def localhost(self) -> str:
        return self.origin.replace("127.0.0.1", "localhost")


Send = Callable[[httpx.Client, Ctx], httpx.Response]


def edit(ref: Callable[[Ctx], str]) -> Send:
    return lambda http, c: http.post("/v1/images/edits", data={**EDIT, "url": ref(c)})


def video(**fields: Callable[[Ctx], Any]) -> Send:
    return lambda http, c: http.post(
        "/v1/videos", json={"prompt": "x", **{k: f(c) for k, f in fields.items()}}
    )


def image_gen(**fields: Callable[[Ctx], Any]) -> Send:
    return lambda http, c: http.post(
        "/v1/images/generations", json={"prompt": "x", **{k: f(c) for k, f in fields.items()}}
    )


def action(ref: Callable[[Ctx], Any]) -> Send:
    return lambda http, c: http.post(
        "/v1/actions/generations",
        json={"input": {"task": "pick", "image": ref(c), "observation": {"state": [0.0] * 8}}},
    )


def chat(ref: Callable[[Ctx], str]) -> Send:
    return lambda http, c: http.post(
        "/v1/chat/completions",
        json={
            "model": c.chat_model,
            "max_tokens": 2,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this?"},
                        {"type": "image_url", "image_url": {"url": ref(c)}},
                    ],
                }
            ],
        },
    )


def upload(name: str) -> Send:
    return lambda http, c: http.post(
        "/v1/images/edits", data=EDIT, files={"image": (name, PNG, "image/png")}
    )


# (case id, server, request, expected status, fragment of the error message)
CASES: list[tuple[str, str, Send, int, str]] = [
    # allowed forms
    ("edit-data-url", "strict", edit(lambda c: DATA_URL), 200, ""),
    ("edit-listed-origin", "strict", edit(lambda c: c.origin + "/img.png"), 200, ""),
    ("edit-same-host-redirect", "strict", edit(lambda c: c.origin + "/to-img"), 200, ""),
    ("edit-local-inside", "strict", edit(lambda c: str(c.media / "ok.png")), 200, ""),
    ("edit-file-url-inside", "strict", edit(lambda c: f"file://{c.media}/ok.png"), 200, ""),
    ("chat-local-inside", "strict", chat(lambda c: str(c.media / "ok.png")), 200, ""),
    # local paths
    ("edit-traversal", "strict", edit(lambda c: c.secret), 400, "outside the allowed directory"),
    (
        "edit-symlink-escape",
        "strict",
        edit(lambda c: str(c.media / "escape.png")),
        400,
        "outside the allowed directory",
    ),
    (
        "edit-file-url-outside",
        "strict",
        edit(lambda c: "file:///etc/passwd"),
        400,
        "outside the allowed directory",
    ),
    (
        "edit-file-url-traversal",
        "strict",
        edit(lambda c: f"file://{c.media}/../secret.png"),
        400,
        "outside the allowed directory",
    ),
    (
        "edit-file-url-remote-host",
        "strict",
        edit(lambda c: f"file://evil.example{c.media}/ok.png"),
        400,
        "localhost",
    ),
    (
        "edit-missing-inside",
        "strict",
        edit(lambda c: str(c.media / "nope.png")),
        400,
        "does not exist",
    ),
    (
        "video-input-reference-traversal",
        "strict",
        video(input_reference=lambda c: c.secret),
        400,
        "outside the allowed directory",
    ),
    (
        "video-video-url-file",
        "strict",
        video(video_url=lambda c: "file:///etc/passwd"),
        400,
        "outside the allowed directory",
    ),
    (
        "action-image-outside",
        "strict",
        action(lambda c: "/etc/passwd"),
        400,
        "outside the allowed directory",
    ),
    (
        "action-image-symlink",
        "strict",
        action(lambda c: str(c.media / "escape.png")),
        400,
        "outside the allowed directory",
    ),
    (
        "chat-file-url-outside",
        "strict",
        chat(lambda c: "file:///etc/passwd"),
        400,
        "outside the allowed directory",
    ),
    (
        "chat-symlink-escape",
        "strict",
        chat(lambda c: str(c.media / "escape.png")),
        400,
        "outside the allowed directory",
    ),
    # remote URLs
    (
        "edit-redirect-to-unlisted-host",
        "strict",
        edit(lambda c: c.origin + "/to-localhost"),
        400,
        "not in the allowed media domains",
    ),
    ("edit-redirect-to-file", "strict", edit(lambda c: c.origin + "/to-file"), 400, "http(s)"),
    ("edit-redirect-loop", "strict", edit(lambda c: c.origin + "/loop"), 400, "redirected more"),
    (
        "edit-unlisted-host",
        "strict",
        edit(lambda c: c.localhost + "/img.png"),
        400,
        "not in the allowed media domains",
    ),
    (
        "edit-ip-suffix-is-not-a-subdomain",
        "strict",
        edit(lambda c: "http://10.127.0.0.1/x.png"),
        400,
        "not in the allowed media domains",
    ),
    (
        "edit-text-as-image",
        "strict",
        edit(lambda c: c.origin + "/text-as-image"),
        400,
        "not a readable image",
    ),
    ("edit-html-content-type", "strict", edit(lambda c: c.origin + "/html"), 400, "text/html"),
    ("edit-bad-ipv6-url", "strict", edit(lambda c: "http://[::1/x.png"), 400, "malformed"),
    ("edit-bad-port", "strict", edit(lambda c: "http://127.0.0.1:99999/x.png"), 400, "malformed"),
    (
        "video-reference-redirect",
        "strict",
        video(reference_url=lambda c: c.origin + "/to-localhost"),
        400,
        "not in the allowed media domains",
    ),
    (
        "chat-redirect-to-unlisted-host",
        "strict",
        chat(lambda c: c.origin + "/to-localhost"),
        400,
        "not in the allowed media domains",
    ),
    # values hidden in extra parameters and JSON-encoded strings
    (
        "extra-params-json-path",
        "strict",
        video(extra_params=lambda c: json.dumps({"input_reference": "/etc/passwd"})),
        400,
        "outside the allowed directory",
    ),
    (
        "json-in-json-path",
        "strict",
        image_gen(
            diffusers_kwargs=lambda c: {
                "x": json.dumps({"nested": [json.dumps({"image_path": c.secret})]})
            }
        ),
        400,
        "outside the allowed directory",
    ),
    (
        "extra-body-url",
        "strict",
        image_gen(extra_body=lambda c: {"anything": "file:///etc/shadow"}),
        400,
        "outside the allowed directory",
    ),
    (
        "forbidden-field-deep",
        "strict",
        image_gen(diffusers_kwargs=lambda c: {"a": [{"b": {"c": {"output_path": "/tmp/x"}}}]}),
        400,
        "cannot be set by requests",
    ),
    (
        "forbidden-field-in-json-string",
        "strict",
        image_gen(extra_body=lambda c: {"opts": json.dumps([{"lora_path": "x"}])}),
        400,
        "cannot be set by requests",
    ),
    (
        "forbidden-model-path-suffix",
        "strict",
        video(extra_args=lambda c: json.dumps({"text_encoder_model_path": "/x"})),
        400,
        "cannot be set by requests",
    ),
    (
        "forbidden-field-action",
        "strict",
        lambda http, c: http.post(
            "/v1/actions/generations",
            json={"input": {"task": "x"}, "parameters": {"output_path": "/tmp/x"}},
        ),
        400,
        "cannot be set by requests",
    ),
    # upload names
    ("upload-name-slash", "strict", upload("../../etc/x.png"), 400, "upload file name"),
    ("upload-name-backslash", "strict", upload("..\\x.png"), 400, "upload file name"),
    ("upload-name-dotdot", "strict", upload(".."), 400, "upload file name"),
    ("upload-name-dotdot-inside", "strict", upload("a..png"), 400, "upload file name"),
    (
        "action-request-id-slash",
        "strict",
        lambda http, c: http.post(
            "/v1/actions/generations", json={"request_id": "../x", "input": {"task": "x"}}
        ),
        400,
        "request_id",
    ),
    # without the options: local paths and loopback hosts are refused
    (
        "bare-edit-local",
        "bare",
        edit(lambda c: str(c.media / "ok.png")),
        400,
        "--allowed-local-media-path",
    ),
    (
        "bare-video-local",
        "bare",
        video(input_reference=lambda c: str(c.media / "ok.png")),
        400,
        "--allowed-local-media-path",
    ),
    (
        "bare-chat-local",
        "bare",
        chat(lambda c: f"file://{c.media}/ok.png"),
        400,
        "--allowed-local-media-path",
    ),
    (
        "bare-action-local",
        "bare",
        action(lambda c: str(c.media / "ok.png")),
        400,
        "--allowed-local-media-path",
    ),
    (
        "bare-rebinding-localhost",
        "bare",
        edit(lambda c: c.localhost + "/img.png"),
        400,
        "non-public address",
    ),
    ("bare-loopback-ip", "bare", edit(lambda c: c.origin + "/img.png"), 400, "non-public address"),
    ("bare-data-url", "bare", edit(lambda c: DATA_URL), 200, ""),
]


@pytest.fixture(scope="module")
def servers(strict: ServerProcess, bare: ServerProcess) -> dict[str, ServerProcess]:
    return {"strict": strict, "bare": bare}


@pytest.fixture(scope="module")
def ctx(strict: ServerProcess, origin: str, media_dir: Path) -> Ctx:
    return Ctx(origin=origin, media=media_dir, chat_model=model_name(strict, "reasoner"))


@pytest.mark.parametrize("case,server,send,status,fragment", CASES, ids=[c[0] for c in CASES])
def test_media_reference(
    servers: dict[str, ServerProcess],
    ctx: Ctx,
    case: str,
    server: str,
    send: Send,
    status: int,
    fragment: str,
) -> None:
    with httpx.Client(base_url=servers[server].base_url, timeout=60) as http:
        response = send(http, ctx)
    assert response.status_code == status, (case, response.text[:500])
    assert "Traceback" not in response.text
    if status >= 400:
        assert fragment in response.json()["error"]["message"], (case, response.text[:500])


@pytest.mark.parametrize(
    "method,path",
    [
        ("GET", "/web/..%2f..%2f..%2fetc%2fpasswd"),
        ("GET", "/web/a%00b.html"),
        ("GET", "/v1/images/..%2f..%2fetc%2fpasswd/content"),
        ("GET", "/v1/images/%00/content"),
        ("GET", "/v1/videos/..%2f..%2fetc/content"),
        ("DELETE", "/v1/videos/%00"),
        ("DELETE", "/v1/streaming/sessions/..%2f%00"),
    ],
)
def test_ids_and_paths_in_urls_are_404(strict: ServerProcess, method: str, path: str) -> None:
    response = httpx.request(method, strict.base_url + path, timeout=30)
    assert response.status_code == 404, (path, response.text[:300])


def test_servers_survived(servers: dict[str, ServerProcess]) -> None:
    for server in servers.values():
        assert_alive(server)
