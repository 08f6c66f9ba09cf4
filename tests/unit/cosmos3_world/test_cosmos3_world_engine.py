"""The realtime engine serving Cosmos3 world sessions: directory detection, engine calls, the
WebSocket route in-process (the app around an InProcessStageClient of the real engine)."""

from __future__ import annotations

import json
import shutil

import msgpack
import numpy as np
import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from tests.unit.cosmos3_world.helpers import (
    NEW_FRAMES,
    SIZE,
    assert_frames_match,
    poses,
    reference_chunks,
    start_image,
)
from tests.unit.realtime.helpers import Replies, run_session, submit
from tests.unit.realtime.inprocess_ws import app_for, read_chunk
from worldserve.config import RealtimeStageConfig, ServerConfig
from worldserve.engines.realtime.engine import RealtimeEngine
from worldserve.errors import InvalidRequest
from worldserve.ipc.messages import ErrorReply, RealtimeChunkResult
from worldserve.models import registry
from worldserve.models.types import ModelLoadError

STAGE = {"num_inference_steps": 2, "max_width": 256, "max_height": 256}


def make_engine(runner) -> RealtimeEngine:
    return RealtimeEngine(RealtimeStageConfig(**STAGE), ServerConfig(), runner=runner)


def frames(reply: RealtimeChunkResult) -> np.ndarray:
    return np.frombuffer(reply.frames, np.uint8).reshape(reply.num_frames, SIZE, SIZE, 3)


def test_a_cosmos3_directory_is_realtime_only_when_configured(cosmos3_dir, world_runner):
    from worldserve.cli import _model_overrides

    assert registry.resolve("realtime", cosmos3_dir).name == "cosmos3"
    assert "realtime" not in registry.stage_kinds(cosmos3_dir)
    assert "stages.realtime.model_path" not in _model_overrides(cosmos3_dir)
    assert world_runner.facts.first_frame == "required" and world_runner.upsampling == 4


def test_a_cosmos3_directory_without_action_heads_is_refused(cosmos3_dir, tmp_path):
    model = tmp_path / "no-actions"
    shutil.copytree(cosmos3_dir, model)
    config_path = model / "transformer" / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "action_gen": False}))
    with pytest.raises(ModelLoadError, match="no action heads"):
        registry.load_runner("realtime", model)


def test_capabilities_declare_an_image_conditioned_camera_model(world_runner):
    caps = make_engine(world_runner).capabilities()
    assert caps.pipeline == "Cosmos3OmniPipeline"
    assert caps.requires_first_frame and caps.supports_guidance and caps.camera_conditioning
    assert (caps.first_chunk_frames, caps.frames_per_chunk) == (NEW_FRAMES + 1, NEW_FRAMES)
    assert caps.size_multiple == 16 and caps.temporal_upsampling == 4
    assert caps.kv_bytes_per_token == 0


def test_engine_session_equals_the_pipeline(world_runner, first_frame):
    engine = make_engine(world_runner)
    replies = Replies()
    cameras = [None, [["w"]] * NEW_FRAMES]
    for k, camera in enumerate(cameras):
        fields = dict(first_frame=first_frame, width=SIZE, height=SIZE, seed=3,
                      prompt="a road") if k == 0 else {}
        submit(engine, "s", k, replies, camera=camera, **fields)
        while engine.has_work():
            engine.step()
    assert all(isinstance(r, RealtimeChunkResult) for r in replies.items), replies.items
    want, _ = reference_chunks(world_runner.model, start_image(first_frame),
                               [poses(("", NEW_FRAMES)), poses(("w", NEW_FRAMES))])
    for reply, expected in zip(replies.items, want):
        assert_frames_match(frames(reply), expected)
    assert engine.stats()["sessions"] == 1 and engine.stats()["extra"]["kv_tokens"] == 0
    assert engine.release("s") and engine.stats()["sessions"] == 0


def test_two_sessions_interleaved_equal_their_solo_runs(world_runner, first_frame):
    solo = run_session(make_engine(world_runner), "a", 2, first_frame=first_frame, width=SIZE,
                       height=SIZE, seed=5)
    engine = make_engine(world_runner)
    a, b = Replies(), Replies()
    for k in range(2):
        first = dict(first_frame=first_frame, width=SIZE, height=SIZE) if k == 0 else {}
        submit(engine, "a", k, a, **(dict(seed=5, **first) if k == 0 else {}))
        submit(engine, "b", k, b, **(dict(seed=9, **first) if k == 0 else {}))
        while engine.has_work():
            engine.step()
    for got, want in zip(a.items, solo):
        np.testing.assert_array_equal(frames(got), frames(want))
    assert not np.array_equal(frames(a.items[0]), frames(b.items[0]))


def test_engine_refuses_an_init_without_first_frame(world_runner):
    with pytest.raises(InvalidRequest, match="first_frame is required"):
        submit(make_engine(world_runner), "s", 0, Replies(), width=SIZE, height=SIZE)


def test_engine_reports_an_undecodable_first_frame_as_invalid(world_runner):
    engine = make_engine(world_runner)
    [reply] = run_session(engine, "s", 1, first_frame=b"\x89PNG broken", width=SIZE,
                          height=SIZE)
    assert isinstance(reply, ErrorReply) and reply.code == "invalid_request"
    assert "first_frame" in reply.message and engine.stats()["sessions"] == 0


def test_websocket_session_streams_the_pipeline_frames(world_runner, first_frame, clients):
    app = app_for(world_runner, clients, STAGE)
    with TestClient(app) as http:
        with http.websocket_connect("/v1/realtime_video/generate") as ws:
            ws.send_bytes(msgpack.packb({"type": "init", "prompt": "a road", "size": "64x64",
                                         "seed": 3, "max_chunks": 2,
                                         "first_frame": first_frame}))
            got = [read_chunk(ws, SIZE), read_chunk(ws, SIZE)]
            with pytest.raises(WebSocketDisconnect) as closed:
                ws.receive_bytes()
        with http.websocket_connect("/v1/realtime_video/generate") as ws:
            ws.send_bytes(msgpack.packb({"type": "init", "prompt": "a road", "size": "64x64"}))
            error = msgpack.unpackb(ws.receive_bytes())
    assert closed.value.code == 1000
    want, _ = reference_chunks(world_runner.model, start_image(first_frame),
                               [poses(("", NEW_FRAMES))] * 2)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    assert error["code"] == "invalid_init" and "first_frame is required" in error["detail"]
