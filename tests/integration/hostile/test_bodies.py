"""Hostile request bodies on every HTTP route, table-driven: sizes, nesting, encodings, images.

Every case: the expected status, never a 500, the server (and every stage) alive afterwards.
"""

from __future__ import annotations

import base64
import io
import json
import select
import socket
import struct
import time
import zlib
from typing import Callable

import httpx
import pytest
from PIL import Image

from tests.integration.hostile.conftest import PNG, assert_alive, model_name, rss_kb
from tests.support.server import ServerProcess

MB = 1024 * 1024
BIG_PROMPT = "x" * MB
EDIT = {"prompt": "x", "size": "64x64", "num_inference_steps": "1"}


def bomb_png(side: int = 20000) -> bytes:
    """A 20000x20000 1-bit grayscale PNG of zeros: a few tens of KB that claim 400 Mpx."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    row = b"\0" * (1 + (side + 7) // 8)
    compressor = zlib.compressobj(9)
    raw = b"".join(compressor.compress(row) for _ in range(side)) + compressor.flush()
    ihdr = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", raw) + chunk(b"IEND", b"")


def jpeg() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 64), (10, 200, 10)).save(out, "JPEG")
    return out.getvalue()


BOMB = bomb_png()
TRUNCATED_JPEG = jpeg()[:300]
NOT_AN_IMAGE = b"this is plain text pretending to be an image" * 10


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def deep_json(levels: int = 10_000) -> bytes:
    return ("[" * levels + "]" * levels).encode()


def deep_object(levels: int = 10_000) -> bytes:
    return ('{"a":' * levels + "1" + "}" * levels).encode()


Send = Callable[[httpx.Client, str], httpx.Response]
JSON = {"content-type": "application/json"}


def raw(path: str, body: bytes, kind: str = "application/json") -> Send:
    return lambda http, m: http.post(path, content=body, headers={"content-type": kind})


def js(path: str, body: Callable[[str], dict]) -> Send:
    return lambda http, m: http.post(path, json=body(m))


def chat_image(data: bytes, mime: str = "image/png") -> Callable[[str], dict]:
    return lambda m: {
        "model": m,
        "max_tokens": 2,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": data_url(data, mime)}}],
            }
        ],
    }


def edit_upload(data: bytes, name: str = "a.png", kind: str = "image/png") -> Send:
    return lambda http, m: http.post(
        "/v1/images/edits", data=EDIT, files={"image": (name, data, kind)}
    )


def video_upload(data: bytes, name: str = "a.png", kind: str = "image/png",
                 prompt: str = "x") -> Send:
    """The image as a multipart `input_reference` file of /v1/videos: read and checked as an
    edit's `image` is, on every family (Cosmos3 has no /v1/images/edits)."""
    return lambda http, m: http.post(
        "/v1/videos", data={"prompt": prompt, "num_inference_steps": "1"},
        files={"input_reference": (name, data, kind)}
    )


def action_b64(data: bytes) -> Send:
    return lambda http, m: http.post(
        "/v1/actions/generations",
        json={
            "input": {
                "task": "x",
                "observation": {
                    "images": {"cam": {"b64_json": base64.b64encode(data).decode()}},
                    "state": [0.0] * 8,
                },
            }
        },
    )


def session(http: httpx.Client) -> str:
    created = http.post("/v1/streaming/sessions", json={"system_prompt": "describe"})
    assert created.status_code == 201, created.text
    return created.json()["session_id"]


def frame(data: bytes, kind: str) -> Send:
    def send(http: httpx.Client, m: str) -> httpx.Response:
        sid = session(http)
        try:
            return http.post(
                f"/v1/streaming/sessions/{sid}/frame", content=data, headers={"content-type": kind}
            )
        finally:
            http.delete(f"/v1/streaming/sessions/{sid}")

    return send


JSON_ROUTES = [
    "/v1/images/generations",
    "/v1/videos",
    "/v1/actions/generations",
    "/v1/streaming/sessions",
    "/v1/chat/completions",
]

CASES: list[tuple[str, Send, int]] = [
    # decompression bombs: a small file that declares 400 Mpx
    ("bomb-video-upload", video_upload(BOMB), 400),
    (
        "bomb-video-reference",
        js("/v1/videos", lambda m: {"prompt": "x", "input_reference": data_url(BOMB)}),
        400,
    ),
    ("bomb-action-image", action_b64(BOMB), 400),
    ("bomb-chat-image", js("/v1/chat/completions", chat_image(BOMB)), 413),
    ("bomb-streaming-frame", frame(BOMB, "image/png"), 413),
    # truncated and fake images
    ("truncated-jpeg-video-upload", video_upload(TRUNCATED_JPEG, "a.jpg", "image/jpeg"), 400),
    (
        "truncated-jpeg-video",
        js(
            "/v1/videos",
            lambda m: {"prompt": "x", "input_reference": data_url(TRUNCATED_JPEG, "image/jpeg")},
        ),
        400,
    ),
    ("truncated-jpeg-action", action_b64(TRUNCATED_JPEG), 400),
    ("text-as-png-video-upload", video_upload(NOT_AN_IMAGE), 400),
    ("text-as-png-chat", js("/v1/chat/completions", chat_image(NOT_AN_IMAGE)), 400),
    ("text-as-jpeg-frame", frame(NOT_AN_IMAGE, "image/jpeg"), 400),
    (
        "text-as-png-video",
        js("/v1/videos", lambda m: {"prompt": "x", "input_reference": data_url(NOT_AN_IMAGE)}),
        400,
    ),
    # 1 MB prompts (limit: 65536 characters)
    ("long-prompt-image", js("/v1/images/generations", lambda m: {"prompt": BIG_PROMPT}), 400),
    ("long-prompt-video", js("/v1/videos", lambda m: {"prompt": BIG_PROMPT}), 400),
    (
        "long-negative-prompt",
        js("/v1/videos", lambda m: {"prompt": "x", "negative_prompt": BIG_PROMPT}),
        400,
    ),
    (
        "long-prompt-in-extras",
        js("/v1/images/generations", lambda m: {"extra_body": json.dumps({"prompt": BIG_PROMPT})}),
        400,
    ),
    ("long-prompt-video-upload", video_upload(PNG, prompt=BIG_PROMPT), 400),
    (
        "long-task-action",
        js("/v1/actions/generations", lambda m: {"input": {"task": BIG_PROMPT}}),
        400,
    ),
    (
        "long-system-prompt",
        js("/v1/streaming/sessions", lambda m: {"system_prompt": BIG_PROMPT}),
        400,
    ),
    (
        "long-chat-text",
        js(
            "/v1/chat/completions",
            lambda m: {"model": m, "messages": [{"role": "user", "content": BIG_PROMPT}]},
        ),
        400,
    ),
    # 10,000 levels of nesting and invalid UTF-8 on every JSON route
    *[(f"deep-array{p.replace('/', '-')}", raw(p, deep_json()), 400) for p in JSON_ROUTES],
    *[(f"deep-object{p.replace('/', '-')}", raw(p, deep_object()), 400) for p in JSON_ROUTES],
    *[
        (f"bad-utf8{p.replace('/', '-')}", raw(p, b'{"prompt": "\xff\xfe\xc3"}'), 400)
        for p in JSON_ROUTES
    ],
    (
        "deep-in-extra-params",
        js("/v1/videos", lambda m: {"prompt": "x", "extra_params": deep_json(900).decode()}),
        400,
    ),
    (
        "deep-guided-json",
        js(
            "/v1/streaming/sessions",
            lambda m: {
                "system_prompt": "x",
                "sampling": {"guided_json": deep_object(5000).decode()},
            },
        ),
        400,
    ),
    (
        "deep-chat-guided-json",
        js(
            "/v1/chat/completions",
            lambda m: {
                "model": m,
                "messages": [{"role": "user", "content": "x"}],
                "guided_json": deep_object(5000).decode(),
            },
        ),
        400,
    ),
    (
        "deep-msgpack-action",
        raw("/v1/actions/generations", b"\x91" * 5000 + b"\xc0", "application/msgpack"),
        400,
    ),
    ("deep-json-frame", frame(deep_json(), "application/json"), 400),
    ("bad-utf8-frame", frame(b'{"image_b64": "\xff\xfe"}', "application/json"), 400),
    # A form field that is not UTF-8 is read as latin-1 (starlette), then judged like any value:
    # here a step count that is no integer, 400 as for every malformed /v1/videos body. Sent to
    # /v1/videos, not /v1/images/edits, whose answer depends on the family (422 for the missing
    # image where edits exist, spec §3.2; 400 naming /v1/videos on Cosmos3, which has none).
    (
        "bad-utf8-multipart",
        raw(
            "/v1/videos",
            b'--b\r\nContent-Disposition: form-data; name="prompt"\r\n\r\n\xff\xfe\r\n'
            b'--b\r\nContent-Disposition: form-data; name="num_inference_steps"\r\n\r\n'
            b"\xff\xfe\r\n--b--\r\n",
            "multipart/form-data; boundary=b",
        ),
        400,
    ),
]

# The same bodies on /v1/images/edits, where a family has an edit mode (the `strict` server's
# Wan: test_the_hostile_server_offers_image_edits); Cosmos3 answers that route 400 before
# reading the body, so these cases belong to no family-neutral catalogue (the soak's).
EDIT_CASES: list[tuple[str, Send, int]] = [
    ("bomb-edit-upload", edit_upload(BOMB), 400),
    ("truncated-jpeg-edit", edit_upload(TRUNCATED_JPEG, "a.jpg", "image/jpeg"), 400),
    ("text-as-png-edit", edit_upload(NOT_AN_IMAGE), 400),
    (
        "long-prompt-edit",
        lambda http, m: http.post(
            "/v1/images/edits",
            data={**EDIT, "prompt": BIG_PROMPT},
            files={"image": ("a.png", PNG, "image/png")},
        ),
        400,
    ),
]


@pytest.fixture(scope="module")
def chat_model(strict: ServerProcess) -> str:
    return model_name(strict, "reasoner")


def test_the_hostile_server_offers_image_edits(strict: ServerProcess) -> None:
    """An edit without its image is the missing field's 422 (spec §3.2), not the 400 of a
    family without edits: EDIT_CASES reach the edit route's reading of the body."""
    response = httpx.post(strict.base_url + "/v1/images/edits", data=EDIT, timeout=60)
    assert response.status_code == 422, response.text[:500]


@pytest.mark.parametrize("case,send,status", CASES + EDIT_CASES,
                         ids=[c[0] for c in CASES + EDIT_CASES])
def test_hostile_body(
    strict: ServerProcess, chat_model: str, case: str, send: Send, status: int
) -> None:
    with httpx.Client(base_url=strict.base_url, timeout=60) as http:
        response = send(http, chat_model)
    assert response.status_code == status, (case, response.text[:500])
    assert "Traceback" not in response.text


# ---------------------------------------------------------------------- 100 MB bodies


def _raw_post(server: ServerProcess, path: str, declared: int | None, total: int) -> int:
    """POST `total` bytes of base64-ish JSON; returns the status the server answered with.

    With `declared`, a Content-Length is sent; else the body is chunked. Stops sending as soon
    as the server answers (it must answer long before the body is complete)."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {declared}\r\n" if declared else "Transfer-Encoding: chunked\r\n"
    prefix = b'{"prompt": "x", "input_reference": "data:image/png;base64,'
    sock.sendall(
        (head + "\r\n").encode() + (prefix if declared else b"%x\r\n%s\r\n" % (len(prefix), prefix))
    )
    block = b"A" * MB
    sent = 0
    try:
        while sent < total:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break
            sock.sendall(block if declared else b"%x\r\n%s\r\n" % (len(block), block))
            sent += len(block)
    except (BrokenPipeError, ConnectionResetError):
        pass
    response = b""
    try:
        while b"\r\n" not in response:
            part = sock.recv(65536)
            if not part:
                break
            response += part
    except ConnectionResetError:
        pass
    sock.close()
    assert sent < total, "the server read the whole 100 MB body"
    return int(response.split()[1]) if response.startswith(b"HTTP/1.1") else -1


@pytest.mark.parametrize("path", JSON_ROUTES + ["/v1/images/edits"])
def test_100mb_declared_body_is_refused_before_reading(strict: ServerProcess, path: str) -> None:
    before = rss_kb(strict.proc.pid)
    assert _raw_post(strict, path, declared=100 * MB, total=100 * MB) == 413
    assert rss_kb(strict.proc.pid) - before < 32 * 1024  # nothing buffered


def test_100mb_chunked_body_is_cut_at_the_limit(strict: ServerProcess) -> None:
    before = rss_kb(strict.proc.pid)
    started = time.monotonic()
    assert _raw_post(strict, "/v1/videos", declared=None, total=100 * MB) == 413
    assert time.monotonic() - started < 30
    # at most the body limit (2 x --max-upload-bytes + 1 MiB) was held, never 100 MB
    assert rss_kb(strict.proc.pid) - before < 200 * 1024


def test_data_url_above_the_upload_cap_is_413(strict: ServerProcess) -> None:
    body = {"prompt": "x", "input_reference": "data:image/png;base64," + "A" * (44 * MB)}
    response = httpx.post(strict.base_url + "/v1/videos", json=body, timeout=60)
    assert response.status_code == 413, response.text[:300]


def test_server_survived(strict: ServerProcess) -> None:
    assert_alive(strict)
