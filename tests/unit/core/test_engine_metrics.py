"""`/metrics` engine figures and `/version`: the app around in-process stage clients of the fake
reasoner and realtime engines (the stage loop's own dispatch, no sockets). Each figure is checked
against what the client itself saw: requests made, tokens in the replies, sessions open."""

from __future__ import annotations

import asyncio
import io
from typing import Iterator

import msgpack
import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

import worldserve
from worldserve.api.app import create_app
from worldserve.api.runtime import ServerRuntime
from worldserve.config import ServerConfig
from worldserve.engines.realtime.fake import FakeRealtimeEngine
from worldserve.engines.reasoner.fake import FakeReasonerEngine
from worldserve.runtime.inprocess import InProcessStageClient

NUM_FRAMES = 3
NUM_CHUNKS = 2


def jpeg(seed: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (32, 24), (seed * 40 % 256, 90, 160)).save(out, "JPEG")
    return out.getvalue()


@pytest.fixture
def http() -> Iterator[TestClient]:
    config = ServerConfig.model_validate({"stages": {
        "generation": {"enabled": False},
        "reasoner": {"backend": "fake"},
        "realtime": {"enabled": True, "backend": "fake",
                     "server_args_overrides": {"frames_per_chunk": 2}}}})
    clients = {"reasoner": InProcessStageClient(
                   "reasoner", FakeReasonerEngine(config.stages.reasoner, config)),
               "realtime": InProcessStageClient(
                   "realtime", FakeRealtimeEngine(config.stages.realtime, config))}
    with TestClient(create_app(ServerRuntime(config=config, clients=clients))) as client:
        yield client
    for stage_client in clients.values():
        asyncio.run(stage_client.close())


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus exposition (the parser also proves it is well-formed)."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def run_workload(http: TestClient) -> int:
    """A REST session with NUM_FRAMES frames (left open), a chat, a realtime session of
    NUM_CHUNKS chunks; returns the tokens the replies reported."""
    session = http.post("/v1/streaming/sessions", json={"system_prompt": "describe"})
    assert session.status_code == 201, session.text
    sid = session.json()["session_id"]
    tokens = 0
    for seed in range(NUM_FRAMES):
        frame = http.post(f"/v1/streaming/sessions/{sid}/frame", content=jpeg(seed),
                          headers={"content-type": "image/jpeg"})
        assert frame.status_code == 200, frame.text
        tokens += frame.json()["token_count"]
    chat = http.post("/v1/chat/completions", json={
        "model": "fake-reasoner", "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 200, chat.text
    tokens += chat.json()["usage"]["completion_tokens"]
    with http.websocket_connect("/v1/realtime_video/generate") as ws:
        ws.send_bytes(msgpack.packb({"type": "init", "prompt": "p", "size": "32x16",
                                     "max_chunks": NUM_CHUNKS}))
        for _ in range(NUM_CHUNKS):
            header = msgpack.unpackb(ws.receive_bytes())
            if header["type"] == "frame_batch_header":
                ws.receive_bytes()
    return tokens


def test_engine_figures_match_what_the_clients_saw(http: TestClient) -> None:
    tokens = run_workload(http)
    got = samples(http.get("/metrics").text)

    def value(name: str, **labels: str) -> float:
        return got[(name, tuple(sorted(labels.items())))]

    count = "worldserve_stage_request_seconds_count"
    assert value(count, stage="reasoner", request="session_frame") == NUM_FRAMES
    assert value(count, stage="reasoner", request="chat_completion") == 1
    assert value(count, stage="realtime", request="realtime_chunk") == NUM_CHUNKS
    assert tokens > 0
    assert value("worldserve_stage_generated_tokens_total", stage="reasoner") == tokens
    assert value("worldserve_stage_sessions", stage="reasoner") == 1  # the REST one, still open
    assert value("worldserve_stage_sessions", stage="realtime") == 0  # released on close
    # the fake realtime engine makes one chunk per step; the +Inf bucket holds every step
    steps = value("worldserve_stage_step_seconds_count", stage="realtime")
    assert steps == NUM_CHUNKS
    assert value("worldserve_stage_step_seconds_bucket", stage="realtime", le="+Inf") == steps
    assert value("worldserve_stage_queue_depth", stage="reasoner") == 0


def test_version() -> None:
    app = create_app(ServerRuntime(config=ServerConfig(), clients={}))
    with TestClient(app) as client:
        assert client.get("/version").json() == {"version": worldserve.__version__}
