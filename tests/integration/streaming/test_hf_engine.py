"""End to end with the REAL reasoner engine (hf backend, tiny dev checkpoint): REST, WebSocket
and chat completions through the same routes as the fake-backend protocol tests. The dev model's
text is meaningless; these tests assert structure, limits and equivalences."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.integration.streaming.support import (
    SESSION_BODY,
    Sessions,
    b64,
    image_bytes,
    nim_error,
    start_server,
)
from tests.integration.streaming.test_ws import (
    assert_closed_with,
    create,
    frame,
    send_json,
    ws_connect,
)
from tests.support.server import ServerProcess

FAST = {"max_tokens": 4}


# The same contract suite on each dev reasoner: Qwen2.5-VL and Cosmos3 Omni.
@pytest.fixture(scope="module", params=["reasoner", "cosmos3-reasoner"])
def hf_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, dev_models_dir: Path
) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("hf")
    config = {
        "stages": {
            "generation": {"enabled": False},
            "realtime": {"enabled": False},
            "reasoner": {"backend": "hf", "model_path": str(dev_models_dir / request.param)},
        }
    }
    server = start_server(workdir, config)
    yield server
    server.stop()


@pytest.fixture
def sessions(hf_server: ServerProcess) -> Iterator[Sessions]:
    with httpx.Client(base_url=hf_server.base_url, timeout=60) as client:
        tracker = Sessions(client)
        yield tracker
        tracker.cleanup()


def test_preflight(sessions: Sessions) -> None:
    http = sessions.client
    assert http.get("/v1/health/ready").status_code == 200
    meta = http.get("/v1/metadata").json()
    config = http.get("/v1/streaming/config").json()
    assert meta["model_type"] == "reasoner"
    # a Cosmos3 checkpoint's profile names its variant too (the dev one is "nano")
    profile = f"worldserve:{config['model']}:hf:float32"
    assert meta["selectedModelProfileId"] in (profile, f"{profile}:nano")
    models = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
    assert "streaming_reasoning" in models[config["model"]]["capabilities"]
    assert models[config["model"]]["max_model_len"] == config["limits"]["max_model_len"]


def test_rest_session_with_every_body_kind(sessions: Sessions) -> None:
    session = sessions.new(sampling=FAST)
    replies = [
        sessions.frame(session, image_bytes(seed=1)),
        sessions.frame(session, image_bytes("PNG", seed=2), headers={"content-type": "image/png"}),
        sessions.frame(session, json={"image_b64": b64(image_bytes(seed=3))}),
    ]
    for index, reply in enumerate(replies):
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["frame_index"] == index
        assert 1 <= body["token_count"] <= FAST["max_tokens"]
        assert body["finish_reason"] in ("stop", "length")
        assert body["latency_s"] is not None and body["engine_ms"] is not None
        assert body["session_tokens"] > 0
    assert sessions.delete(session).json() == {"session_id": session, "frames": 3, "closed": True}


def test_corrupt_image_is_400_and_the_session_continues(sessions: Sessions) -> None:
    session = sessions.new(sampling=FAST)
    jpeg = image_bytes(size=(256, 256))
    nim_error(sessions.frame(session, jpeg[: len(jpeg) // 2]), 400)
    assert sessions.frame(session, jpeg).json()["frame_index"] == 0


def test_guided_choice_on_the_real_engine(sessions: Sessions) -> None:
    session = sessions.new(sampling={"max_tokens": 8, "guided_choice": ["clear", "hazard"]})
    for seed in range(2):
        reply = sessions.frame(session, image_bytes(seed=seed)).json()
        assert reply["text"] in ("clear", "hazard")


def test_admission_and_capacity_on_the_real_engine(sessions: Sessions) -> None:
    http = sessions.client
    limit = http.get("/v1/streaming/config").json()["limits"]["max_model_len"]
    message = nim_error(
        sessions.create(retention={"max_video_segments": 4, "max_session_tokens": limit}), 400
    )
    assert "must be below the model context length" in message
    message = nim_error(sessions.create(retention={"max_session_tokens": 1024}), 400)
    assert message == "retention window needs 60 image slots; the limit is 32"
    sessions.new(), sessions.new()
    assert nim_error(sessions.create(), 503) == "session slots exhausted (2/2)"


def test_websocket_binary_and_base64(hf_server: ServerProcess) -> None:
    with ws_connect(hf_server) as ws:
        created = create(ws, sampling=FAST)
        assert created["op"] == "created" and created["frame_format"] == "binary"
        for index in range(2):
            assert frame(ws, image_bytes(seed=index))["frame_index"] == index
        assert send_json(ws, {"op": "update"})["fatal"] is False
        assert send_json(ws, {"op": "delete"})["frames"] == 2
        assert_closed_with(ws, 1000)
    with ws_connect(hf_server) as ws:
        assert create(ws, sampling=FAST, frame_format="base64")["op"] == "created"
        reply = send_json(ws, {"op": "frame", "image_b64": b64(image_bytes("PNG"))})
        assert reply["op"] == "frame" and reply["frame_index"] == 0


def test_greedy_replies_match_across_transports(
    hf_server: ServerProcess, sessions: Sessions
) -> None:
    greedy = {"max_tokens": 4, "temperature": 0}
    frames = [image_bytes(seed=i) for i in range(2)]
    session = sessions.new(sampling=greedy)
    rest = [sessions.frame(session, f).json()["text"] for f in frames]
    sessions.delete(session)
    with ws_connect(hf_server) as ws:
        ws.send(json.dumps({"op": "create", **SESSION_BODY, "sampling": greedy}))
        assert json.loads(ws.recv(timeout=30))["op"] == "created"
        assert [frame(ws, f)["text"] for f in frames] == rest


def test_chat_completion_stream_equals_one_shot(sessions: Sessions) -> None:
    http = sessions.client
    model = http.get("/v1/streaming/config").json()["model"]
    content = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64," + b64(image_bytes())}},
    ]
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 6,
        "temperature": 0,
    }
    whole = http.post("/v1/chat/completions", json=body).json()
    assert whole["usage"]["completion_tokens"] >= 1
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == whole["choices"][0]["message"]["content"]
