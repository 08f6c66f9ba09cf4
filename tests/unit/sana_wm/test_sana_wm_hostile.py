"""Hostile realtime input on a SANA-WM engine: each bad chunk gets a clear invalid_request (at
submit or as the chunk's reply), leaves no session behind, and the engine still serves."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.realtime.helpers import Replies, run_session, submit
from tests.unit.sana_wm.helpers import NEW_FRAMES, SIZE
from worldserve.config import RealtimeStageConfig, ServerConfig
from worldserve.engines.realtime.engine import RealtimeEngine
from worldserve.errors import InvalidRequest
from worldserve.ipc.messages import ErrorReply, RealtimeChunkResult

BAD_INITS = [
    ("no first frame", {"first_frame": None}, "first_frame is required"),
    ("truncated png", {"first_frame": b"\x89PNG\r\n\x1a\n" + b"\0" * 20}, "not a decodable"),
    ("text as image", {"first_frame": b"hello"}, "not a decodable"),
    ("size not /32", {"width": 48}, "multiple of 32"),
    ("size too big", {"width": 4096}, "multiple of 32 in 32..256"),
    ("zero steps", {"num_inference_steps": 0}, None),  # 0 -> the stage default: accepted
    ("too many steps", {"num_inference_steps": 17}, "num_inference_steps must be in 1..16"),
    ("guidance below 1", {"guidance_scale": 0.5}, "guidance_scale must be >= 1.0"),
    ("window past the refiner's", {"window_frames": 12}, "<= 11"),
    ("negative sink", {"sink_size": -1}, "sink size must be >= 0"),
    ("unknown camera key", {"camera": [["x"]]}, "unknown camera key 'x'"),
    ("camera too long", {"camera": [["w"]] * (NEW_FRAMES + 2)}, "at most 25"),
]


@pytest.fixture
def engine(refined_runner):
    return RealtimeEngine(RealtimeStageConfig(num_inference_steps=2, max_width=256,
                                              max_height=256), ServerConfig(),
                          runner=refined_runner)


@pytest.mark.parametrize("name, fields, message", BAD_INITS, ids=[c[0] for c in BAD_INITS])
def test_bad_init_is_refused_clearly(engine, first_frame, name, fields, message):
    values = {"first_frame": first_frame, "width": SIZE, "height": SIZE, **fields}
    if message is None:
        [reply] = run_session(engine, "s", 1, **values)
        assert isinstance(reply, RealtimeChunkResult)
        return
    replies = Replies()
    try:
        submit(engine, "s", 0, replies, **values)
        while engine.has_work():
            engine.step()
    except InvalidRequest as exc:  # refused at submit
        assert message in exc.message, exc.message
    else:  # refused when the chunk ran
        [reply] = replies.items
        assert isinstance(reply, ErrorReply) and reply.code == "invalid_request", reply
        assert message in reply.message, reply.message
    assert engine.stats()["sessions"] == 0


def test_out_of_order_and_unknown_chunks(engine, first_frame):
    run_session(engine, "s", 1, first_frame=first_frame, width=SIZE, height=SIZE)
    replies = Replies()
    submit(engine, "s", 3, replies)
    engine.step()
    assert replies.last().code == "invalid_request" and "expects chunk 1" in replies.last().message
    with pytest.raises(Exception, match="not found"):
        submit(engine, "ghost", 2, Replies())


def test_engine_serves_after_hostile_input(engine, first_frame):
    for _name, fields, _message in BAD_INITS:
        try:
            run_session(engine, "bad", 1, **{"first_frame": first_frame, "width": SIZE,
                                             "height": SIZE, **fields})
        except InvalidRequest:
            pass
    replies = run_session(engine, "good", 2, first_frame=first_frame, width=SIZE, height=SIZE)
    assert [r.num_frames for r in replies] == [NEW_FRAMES + 1, NEW_FRAMES]
    frames = np.frombuffer(replies[1].frames, np.uint8)
    assert frames.size == NEW_FRAMES * SIZE * SIZE * 3
