"""The realtime engine serving SANA-WM sessions: engine calls, then the WebSocket route in-process
(the app around an InProcessStageClient of the real engine and the tiny pipeline)."""

from __future__ import annotations

import io

import msgpack
import numpy as np
import pytest
from PIL import Image
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from tests.unit.realtime.helpers import Replies, run_session, submit
from tests.unit.realtime.inprocess_ws import app_for, read_chunk
from tests.unit.sana_wm.helpers import NEW_FRAMES, SIZE, reference_chunks
from worldserve.config import RealtimeStageConfig, ServerConfig
from worldserve.engines.realtime.engine import RealtimeEngine
from worldserve.errors import InvalidRequest
from worldserve.ipc.messages import ErrorReply, RealtimeChunkResult

STAGE = {"num_inference_steps": 2, "max_width": 256, "max_height": 256}


def make_engine(runner) -> RealtimeEngine:
    return RealtimeEngine(RealtimeStageConfig(**STAGE), ServerConfig(), runner=runner)


def frames(reply: RealtimeChunkResult) -> np.ndarray:
    return np.frombuffer(reply.frames, np.uint8).reshape(reply.num_frames, SIZE, SIZE, 3)


def test_capabilities_declare_an_image_conditioned_camera_model(refined_runner):
    caps = make_engine(refined_runner).capabilities()
    assert caps.pipeline == "SanaWMPipeline+SanaWMLTX2Refiner"
    assert caps.supports_first_frame and caps.requires_first_frame and caps.supports_guidance
    assert (caps.first_chunk_frames, caps.frames_per_chunk) == (NEW_FRAMES + 1, NEW_FRAMES)
    assert caps.size_multiple == 32 and caps.temporal_upsampling == 8
    assert caps.kv_bytes_per_token > 0 and caps.max_window_frames == 11


def test_engine_runs_a_session_equal_to_the_pipeline(runner, sana_pipe, first_frame):
    engine = make_engine(runner)
    replies = run_session(engine, "s", 3, first_frame=first_frame, width=SIZE, height=SIZE,
                          seed=3, prompt="a road")
    assert all(isinstance(r, RealtimeChunkResult) for r in replies), replies
    want, _ = reference_chunks(sana_pipe, Image.open(io.BytesIO(first_frame)).convert("RGB"),
                               ["none-24"] * 3)
    for reply, expected in zip(replies, want):
        np.testing.assert_array_equal(frames(reply), expected)
    assert engine.stats()["sessions"] == 1


def test_engine_refuses_an_init_without_first_frame(runner):
    engine = make_engine(runner)
    with pytest.raises(InvalidRequest, match="first_frame is required"):
        submit(engine, "s", 0, Replies(), width=SIZE, height=SIZE)


def test_engine_reports_an_undecodable_first_frame_as_invalid(runner):
    engine = make_engine(runner)
    [reply] = run_session(engine, "s", 1, first_frame=b"\x89PNG broken", width=SIZE,
                          height=SIZE)
    assert isinstance(reply, ErrorReply) and reply.code == "invalid_request"
    assert "first_frame" in reply.message and engine.stats()["sessions"] == 0


def test_websocket_session_streams_the_pipeline_frames(runner, sana_pipe, first_frame, clients):
    app = app_for(runner, clients, STAGE)
    with TestClient(app) as http:
        with http.websocket_connect("/v1/realtime_video/generate") as ws:
            ws.send_bytes(msgpack.packb({"type": "init", "prompt": "a road", "size": "64x64",
                                         "seed": 3, "max_chunks": 2,
                                         "first_frame": first_frame}))
            got = [read_chunk(ws, SIZE), read_chunk(ws, SIZE)]
            with pytest.raises(WebSocketDisconnect) as closed:
                ws.receive_bytes()
    assert closed.value.code == 1000
    want, _ = reference_chunks(sana_pipe, Image.open(io.BytesIO(first_frame)).convert("RGB"),
                               ["none-24"] * 2)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_websocket_init_without_first_frame_is_invalid(runner, clients):
    app = app_for(runner, clients, STAGE)
    with TestClient(app) as http:
        with http.websocket_connect("/v1/realtime_video/generate") as ws:
            ws.send_bytes(msgpack.packb({"type": "init", "prompt": "a road", "size": "64x64"}))
            error = msgpack.unpackb(ws.receive_bytes())
    assert error["type"] == "error" and error["code"] == "invalid_init"
    assert "first_frame is required" in error["detail"]


def test_registry_loads_a_saved_directory_with_its_refiner(tmp_path, first_frame):
    from worldserve.models import registry
    from worldserve.models.sana_wm.dev import build_sana_wm

    build_sana_wm(tmp_path, 0)
    loaded = registry.load_runner("realtime", tmp_path)
    assert loaded.refiner is not None and loaded.facts.first_frame == "required"
    engine = make_engine(loaded)
    replies = run_session(engine, "s", 2, first_frame=first_frame, width=SIZE, height=SIZE)
    assert [r.num_frames for r in replies] == [NEW_FRAMES + 1, NEW_FRAMES]
    assert replies[-1].cached_frames == 7  # refiner sink + two refined blocks


def test_intrinsics_from_the_init_reach_the_pipeline(runner, sana_pipe, first_frame):
    engine = make_engine(runner)
    intrinsics = [30.0, 34.0, 44.0, 20.0]  # in first_frame (80x48) pixels
    replies = run_session(engine, "s", 2, first_frame=first_frame, width=SIZE, height=SIZE,
                          seed=3, prompt="a road", intrinsics=intrinsics)
    image = Image.open(io.BytesIO(first_frame)).convert("RGB")
    want, _ = reference_chunks(sana_pipe, image, ["none-24"] * 2, intrinsics=intrinsics)
    default, _ = reference_chunks(sana_pipe, image, ["none-24"] * 2)
    for reply, expected in zip(replies, want):
        np.testing.assert_array_equal(frames(reply), expected)
    assert not np.array_equal(frames(replies[0]), default[0])


@pytest.mark.parametrize("intrinsics, ok", [
    ([40, 40, 32, 32], True), ([[40, 0, 32], [0, 40, 32], [0, 0, 1]], True),
    ([40, 40, 32], False), ([0, 40, 32, 32], False), (["a", 1, 2, 3], False),
])
def test_websocket_checks_intrinsics(runner, first_frame, clients, intrinsics, ok):
    app = app_for(runner, clients, STAGE)
    with TestClient(app) as http:
        with http.websocket_connect("/v1/realtime_video/generate") as ws:
            ws.send_bytes(msgpack.packb({"type": "init", "prompt": "a road", "size": "64x64",
                                         "max_chunks": 1, "first_frame": first_frame,
                                         "condition_inputs": {"intrinsics": intrinsics}}))
            if ok:
                assert len(read_chunk(ws, SIZE)) == NEW_FRAMES + 1
            else:
                error = msgpack.unpackb(ws.receive_bytes())
                assert error["code"] == "invalid_init"
                assert "intrinsics" in error["detail"], error
