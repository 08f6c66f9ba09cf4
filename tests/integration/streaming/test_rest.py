"""REST sessions against a live server on the fake backend (spec sections 3-7 and 9)."""

from __future__ import annotations

import re
import select
import socket
import threading

import httpx
import pytest

from tests.integration.streaming.conftest import FAIL_ON_FRAME
from tests.integration.streaming.support import (
    SESSION_BODY,
    Sessions,
    b64,
    image_bytes,
    nim_error,
)

SESSION_ID = re.compile(
    r"^sess-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$"
)
LIBRARY_RETENTION = {
    "max_video_segments": 30,
    "max_text_tokens": None,
    "max_session_tokens": 7000,
    "eviction_policy": "sliding_window",
    "reprefill_threshold": 0.7,
}
FRAME_FIELDS = {
    "frame_index",
    "text",
    "finish_reason",
    "token_count",
    "ttft_s",
    "latency_s",
    "decode_ms",
    "build_ms",
    "engine_ms",
    "inqueue_ms",
    "evicted_segments",
    "reprefill_ms",
    "session_tokens",
}


# ---------------------------------------------------------------- pre-flight


def test_preflight_matches_the_cookbook_checks(http: httpx.Client) -> None:
    ready = http.get("/v1/health/ready")
    assert ready.status_code == 200
    assert ready.json()["message"] == "Service is ready."
    meta = http.get("/v1/metadata").json()
    assert meta["model_type"] == "reasoner"
    assert meta["inference_endpoint"] == "/v1/chat/completions"
    assert meta["selectedModelProfileId"] == "worldserve:fake-reasoner:fake:float32"
    assert meta["streaming"] == {"enabled": True, "websocket": True, "rest": True}
    config = http.get("/v1/streaming/config").json()
    models = http.get("/v1/models").json()["data"]
    entry = next(m for m in models if m["id"] == config["model"])
    assert entry["capabilities"][0] == "streaming_reasoning"
    assert entry["max_model_len"] == config["limits"]["max_model_len"] == 16384


def test_config_shows_server_policy_and_limits(http: httpx.Client) -> None:
    config = http.get("/v1/streaming/config").json()
    assert config["retention"] == {**LIBRARY_RETENTION, "max_video_segments": 8}
    assert config["sampling"] == {
        "max_tokens": 24,
        "temperature": 0.3,
        "top_p": 0.9,
        "repetition_penalty": 1.1,
        "frequency_penalty": 0.0,
    }
    assert config["limits"] == {
        "max_sessions": 2,
        "max_frame_bytes": 8388608,
        "max_frame_pixels": 4194304,
        "idle_timeout_s": 900.0,
        "rest_idle_timeout_s": 120.0,
        "frame_timeout_s": 120.0,
        "image_budget": 32,
        "encoder_capacity": 32,
        "max_model_len": 16384,
    }


# ---------------------------------------------------------------- creation


def test_create_answers_201_with_effective_settings(sessions: Sessions) -> None:
    response = sessions.create(fps=2.5, sampling={"max_tokens": 48}, model="fake-reasoner")
    assert response.status_code == 201
    body = response.json()
    assert SESSION_ID.match(body["session_id"])
    assert body["model"] == "fake-reasoner"
    assert body["fps"] == 2.5
    assert body["retention"] == {**LIBRARY_RETENTION, "max_video_segments": 8}
    assert body["sampling"] == {
        "max_tokens": 48,
        "temperature": 0.3,
        "top_p": 0.9,
        "repetition_penalty": 1.1,
        "frequency_penalty": 0.0,
    }


def test_supplied_retention_is_built_from_library_defaults(sessions: Sessions) -> None:
    body = sessions.create(retention={"max_video_segments": 4}).json()
    assert body["retention"] == {**LIBRARY_RETENTION, "max_video_segments": 4}
    message = nim_error(sessions.create(retention={"max_session_tokens": 8000}), 400)
    assert message == "retention window needs 60 image slots; the limit is 32"


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({"retention": {"max_video_segments": 4, "foo": 1}}, "unknown retention field 'foo'"),
        ({"retention": {"max_video_segments": 0}}, "retention.max_video_segments"),
        ({"retention": {"max_session_tokens": 512}}, "retention.max_session_tokens"),
        ({"retention": {"max_session_tokens": None}}, "retention.max_session_tokens"),
        ({"retention": {"reprefill_threshold": 1.0}}, "retention.reprefill_threshold"),
        ({"retention": {"eviction_policy": "lru"}}, "retention.eviction_policy"),
        (
            {"retention": {"max_video_segments": 4, "max_text_tokens": 8000}},
            "retention.max_text_tokens (8000) must not exceed max_session_tokens (7000)",
        ),
        ({"retention": "all"}, "retention"),
        ({"sampling": {"top_p": 0}}, "sampling.top_p"),
        ({"sampling": {"max_tokens": 0}}, "sampling.max_tokens"),
        ({"sampling": {"temperature": -1}}, "sampling.temperature"),
        ({"sampling": {"frequency_penalty": 3}}, "sampling.frequency_penalty"),
        ({"sampling": {"bogus": 1}}, "unknown sampling field 'bogus'"),
        ({"sampling": {"guided_choice": []}}, "sampling.guided_choice"),
        ({"sampling": {"guided_json": "{not json"}}, "sampling.guided_json is not valid JSON"),
        ({"sampling": {"guided_regex": "(unclosed"}}, "guided_regex does not compile"),
        (
            {"sampling": {"guided_choice": ["a"], "guided_regex": "a"}},
            "at most one of guided_json, guided_choice, guided_regex may be set",
        ),
        (
            {"sampling": {"max_tokens": 9999}},
            "max_session_tokens + max_tokens (16999) must be below the model context length (16384)",  # noqa: E501
        ),
        (
            {"retention": {"max_video_segments": 8, "reprefill_threshold": 0.2}},
            "max_session_tokens (7000) must be below reprefill_threshold × max_position_embeddings "
            "(6553.6)",
        ),
        ({"system_prompt": "   "}, "system_prompt"),
        ({"system_prompt": None}, "system_prompt"),
        ({"fps": 0}, "fps"),
    ],
)
def test_invalid_configuration_is_400(sessions: Sessions, overrides: dict, expected: str) -> None:
    message = nim_error(sessions.create(**overrides), 400)
    assert expected in message


def test_body_errors_are_400_not_422(http: httpx.Client) -> None:
    for kwargs in (
        {"content": b"{not json", "headers": {"content-type": "application/json"}},
        {"json": {"question": "no system prompt"}},
        {"json": [1, 2]},
    ):
        message = nim_error(http.post("/v1/streaming/sessions", **kwargs), 400)
        assert message


def test_model_is_checked_before_the_configuration(sessions: Sessions) -> None:
    message = nim_error(sessions.create(model="other", retention={"bogus": 1}), 404)
    assert message == "unknown model 'other'"


def test_capacity_is_503_until_a_session_is_deleted(sessions: Sessions) -> None:
    first, _ = sessions.new(), sessions.new()
    assert nim_error(sessions.create(), 503) == "session slots exhausted (2/2)"
    assert sessions.delete(first).status_code == 200
    assert sessions.create().status_code == 201


def test_shared_encoder_capacity(sessions: Sessions) -> None:
    sessions.new(retention={"max_video_segments": 16})
    message = nim_error(sessions.create(), 503)
    assert message == "shared encoder capacity exhausted (32+16 > 32)"


# ---------------------------------------------------------------- frames


def test_frames_in_every_body_kind(sessions: Sessions) -> None:
    session = sessions.new()
    jpeg, png = image_bytes("JPEG"), image_bytes("PNG", seed=3)
    replies = [
        sessions.frame(session, jpeg),
        sessions.frame(session, png, headers={"content-type": "image/png"}),
        sessions.frame(session, jpeg, headers={"content-type": "application/octet-stream"}),
        sessions.frame(session, json={"image_b64": b64(png)}),
        sessions.frame(
            session, json={"image_b64": "data:image/jpeg;base64," + b64(jpeg), "extra": "ignored"}
        ),
    ]
    for index, reply in enumerate(replies):
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert set(body) == FRAME_FIELDS
        assert body["frame_index"] == index
        assert body["text"] and body["text"] == body["text"].strip()
        assert body["finish_reason"] in ("stop", "length")
    deleted = sessions.delete(session)
    assert deleted.status_code == 200
    assert deleted.json() == {"session_id": session, "frames": 5, "closed": True}


def test_replies_are_deterministic(sessions: Sessions) -> None:
    a, b = sessions.new(), sessions.new()
    frames = [image_bytes(seed=i) for i in range(2)]
    texts_a = [sessions.frame(a, f).json()["text"] for f in frames]
    texts_b = [sessions.frame(b, f).json()["text"] for f in frames]
    assert texts_a == texts_b


def test_guided_choice_constrains_every_reply(sessions: Sessions) -> None:
    session = sessions.new(sampling={"max_tokens": 8, "guided_choice": ["clear", "hazard"]})
    for seed in range(3):
        assert sessions.frame(session, image_bytes(seed=seed)).json()["text"] in ("clear", "hazard")


@pytest.mark.parametrize(
    "kwargs, status, expected",
    [
        (
            {"content": b"hello", "headers": {"content-type": "text/plain"}},
            415,
            "unsupported media type 'text/plain'; send application/json with image_b64, or image/jpeg "  # noqa: E501
            "or image/png",
        ),
        (
            {"content": image_bytes("GIF"), "headers": {"content-type": "image/jpeg"}},
            400,
            "frames must be JPEG or PNG",
        ),
        (
            {
                "content": image_bytes("PNG"),
                "headers": {"content-type": "image/png"},
                "truncate": 40,
            },
            400,
            "invalid PNG image",
        ),
        ({"json": {"image_b64": "***"}}, 400, "image_b64 is not valid base64"),
        ({"json": {"other": 1}}, 400, "image_b64 is missing or empty"),
        ({"json": ["x"]}, 400, "frame body must be a JSON object"),
        (
            {"content": b"{oops", "headers": {"content-type": "application/json"}},
            400,
            "frame body is not valid JSON",
        ),
        (
            {
                "content": image_bytes("PNG", size=(4096, 2048)),
                "headers": {"content-type": "image/png"},
            },
            413,
            "frame is 4096x2048 = 8388608 pixels; the limit is 4194304",
        ),
    ],
)
def test_bad_frames_leave_the_session_unchanged(
    sessions: Sessions, kwargs: dict, status: int, expected: str
) -> None:
    session = sessions.new()
    if "truncate" in kwargs:
        kwargs["content"] = kwargs["content"][: kwargs.pop("truncate")]
    assert expected in nim_error(sessions.frame(session, **kwargs), status)
    assert sessions.frame(session, image_bytes()).json()["frame_index"] == 0


def test_truncated_jpeg_is_400_from_the_decoder(sessions: Sessions) -> None:
    session = sessions.new()
    jpeg = image_bytes(size=(256, 256))
    assert "invalid image" in nim_error(sessions.frame(session, jpeg[: len(jpeg) // 2]), 400)
    assert sessions.frame(session, jpeg).json()["frame_index"] == 0


def _raw_request(port: int, head: str, body: bytes) -> bytes:
    """Send `head` + `body` on a raw socket; return what the server answered."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head.encode() + body)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


def test_oversized_frame_is_413_before_the_body_is_read(fake_server, sessions: Sessions) -> None:
    session = sessions.new()
    size = 9 * 1024 * 1024
    head = (
        f"POST /v1/streaming/sessions/{session}/frame HTTP/1.1\r\nHost: x\r\n"
        f"Content-Type: image/jpeg\r\nContent-Length: {size}\r\n\r\n"
    )
    # Only 1 KiB of the announced 9 MiB is ever sent: the answer proves nothing more was read.
    answer = _raw_request(fake_server.port, head, b"\xff\xd8\xff" + b"\0" * 1021)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    json_head = head.replace("image/jpeg", "application/json")
    answer = _raw_request(
        fake_server.port, json_head.replace(str(size), str(12 * 1024 * 1024)), b"{"
    )
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


def _chunked_upload(port: int, path: str, num_bytes: int,
                    piece_size: int = 64 * 1024) -> httpx.Response:
    """POST `num_bytes` with chunked transfer encoding (no Content-Length) on a raw socket. The
    server may answer and close before the body ends, so sending stops as soon as an answer is
    readable or the connection is gone; the answer is read either way (Linux hands over the
    bytes that arrived before a reset)."""
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\n"
            "Transfer-Encoding: chunked\r\n\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head.encode())
        try:
            for _ in range(num_bytes // piece_size):
                if select.select([sock], [], [], 0)[0]:
                    break  # the server answered mid-body
                sock.sendall(b"%x\r\n" % piece_size + b"\xff" * piece_size + b"\r\n")
            else:
                sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed after answering: the answer is read below
        return _read_response(sock)


def _read_response(sock: socket.socket) -> httpx.Response:
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            length = re.search(rb"(?i)content-length: *(\d+)", head)
            if length and len(body) >= int(length.group(1)):
                break
    except ConnectionResetError:
        pass  # the reset after the answer; an incomplete answer fails the asserts below
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), data[:200]
    return httpx.Response(int(head.split()[1]), content=body)


def test_streamed_body_is_counted_without_a_content_length(fake_server, sessions: Sessions) -> None:
    session = sessions.new()
    response = _chunked_upload(fake_server.port, f"/v1/streaming/sessions/{session}/frame",
                               9 * 1024 * 1024)
    assert "exceeds the limit of 8388608 bytes" in nim_error(response, 413)
    assert sessions.frame(session, image_bytes()).json()["frame_index"] == 0


def test_oversized_base64_frame_is_413(sessions: Sessions) -> None:
    session = sessions.new()
    big = b"\xff\xd8\xff" + bytes(8 * 1024 * 1024)
    assert "8 MiB" in nim_error(sessions.frame(session, json={"image_b64": b64(big)}), 413)


# ---------------------------------------------------------------- lifecycle


def test_unknown_and_deleted_sessions_are_404(sessions: Sessions) -> None:
    assert "not found" in nim_error(sessions.frame("sess-nope", image_bytes()), 404)
    assert "not found" in nim_error(sessions.delete("sess-nope"), 404)
    session = sessions.new()
    assert sessions.delete(session).status_code == 200
    nim_error(sessions.frame(session, image_bytes()), 404)
    nim_error(sessions.delete(session), 404)


def test_engine_failure_is_500_then_409(sessions: Sessions) -> None:
    session = sessions.new()
    for index in range(FAIL_ON_FRAME):
        assert sessions.frame(session, image_bytes(seed=index)).status_code == 200
    assert "fake engine failure" in nim_error(sessions.frame(session, image_bytes()), 500)
    message = nim_error(sessions.frame(session, image_bytes()), 409)
    assert message == "session is no longer usable; create a new session"
    deleted = sessions.delete(session)
    assert deleted.json() == {"session_id": session, "frames": FAIL_ON_FRAME, "closed": True}
    # the dead session's slot is free again
    sessions.new(), sessions.new()


def test_concurrent_creations_never_exceed_capacity(http: httpx.Client, sessions: Sessions) -> None:
    responses: list[httpx.Response] = []

    def create() -> None:
        responses.append(http.post("/v1/streaming/sessions", json=SESSION_BODY))

    threads = [threading.Thread(target=create) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sessions.ids += [r.json()["session_id"] for r in responses if r.status_code == 201]
    assert sorted(r.status_code for r in responses) == [201, 201, 503, 503]
