"""Engine behaviour: session lifecycle, errors, determinism, scheduling, refresh and re-base."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from tests.unit.realtime.helpers import Replies, chunk, open_session, run_session, submit
from worldserve.config import RealtimeStageConfig, ServerConfig
from worldserve.engines.realtime.engine import RealtimeEngine
from worldserve.errors import InvalidRequest, NotFound
from worldserve.ipc.messages import (
    ErrorReply,
    RealtimeChunkResult,
    RealtimeOpened,
    RealtimeRelease,
    RealtimeReleased,
)
from worldserve.models.causal_dit.loader import RealtimeModel
from worldserve.models.causal_dit.runner import CausalRunner
from worldserve.models.types import WorldSessionState as SessionState

SMALL = dict(width=32, height=32, num_inference_steps=2)


def frames_of(replies) -> list[bytes]:
    assert all(isinstance(r, RealtimeChunkResult) for r in replies), replies
    return [r.frames for r in replies]


def test_chunk_results_have_the_contract_shape(make_engine):
    engine = make_engine()
    replies = run_session(engine, "s", 3, width=48, height=32)
    caps = engine.capabilities()
    assert [r.num_frames for r in replies] == [caps.first_chunk_frames,
                                               caps.frames_per_chunk, caps.frames_per_chunk]
    for r in replies:
        assert (r.width, r.height) == (48, 32)
        assert len(r.frames) == r.num_frames * 48 * 32 * 3
        assert r.forward_ms > 0 and r.kv_refresh_ms is None
    assert [r.chunk_index for r in replies] == [0, 1, 2]


def test_capabilities_give_the_api_what_it_needs(make_engine):
    caps = make_engine().capabilities()
    assert caps.realtime_supported is True and caps.camera_conditioning is True
    assert caps.frames_per_chunk == 12 and caps.latent_frames_per_block == 3
    assert caps.max_script_frames == 512 and caps.min_pulse_items == 1
    for key in ("pipeline", "default_fps", "default_width", "default_height",
                "default_num_inference_steps", "default_sink_frames", "default_window_frames",
                "max_width", "max_height"):
        assert getattr(caps, key) is not None


def test_same_seed_same_frames_alone_or_interleaved(make_engine):
    alone = frames_of(run_session(make_engine(), "a", 3, seed=5, **SMALL))
    engine = make_engine()
    out = {"a": Replies(), "b": Replies(), "c": Replies()}
    for k in range(3):
        submit(engine, "a", k, out["a"], **(dict(seed=5, **SMALL) if k == 0 else {}))
        submit(engine, "b", k, out["b"], **(dict(seed=5, **SMALL) if k == 0 else {}))
        submit(engine, "c", k, out["c"], **(dict(seed=6, **SMALL) if k == 0 else {}))
        while engine.has_work():
            engine.step()
    assert frames_of(out["a"].items) == alone
    assert frames_of(out["b"].items) == alone
    assert frames_of(out["c"].items) != alone


def test_round_robin_across_sessions_reports_queue_time(make_engine):
    engine = make_engine()
    order: list[str] = []
    for sid in ("a", "b"):
        submit(engine, sid, 0, lambda m: order.append(m.session_id), **SMALL)
    for sid in ("a", "b"):
        for k in (1, 2):  # chunks may be queued before the previous one has run
            submit(engine, sid, k, lambda m: order.append(m.session_id))
    replies = Replies()
    submit(engine, "a", 3, replies)
    while engine.has_work():
        engine.step()
    assert order == ["a", "b", "a", "b", "a", "b"]
    assert replies.last().queue_ms > 0


def test_release_frees_everything_and_is_idempotent(make_engine):
    engine = make_engine()
    run_session(engine, "s", 2, **SMALL)
    session = engine.sessions.get("s")
    assert session.cache.num_tokens > 0
    out = Replies()
    engine.submit(chunk("s", 2), out)  # queued, then released before it runs
    engine.submit(RealtimeRelease(request_id="rel1", session_id="s"), out)
    assert isinstance(out.items[0], ErrorReply) and out.items[0].code == "not_found"
    assert out.items[1] == RealtimeReleased(request_id="rel1", session_id="s", existed=True)
    assert session.state is SessionState.RELEASED
    assert session.cache.kv is None and session.cache.latents is None
    assert session.decoder.feat_cache is None and session.text_kv is None
    assert engine.stats()["sessions"] == 0 and not engine.has_work()
    engine.submit(RealtimeRelease(request_id="rel2", session_id="s"), out)
    assert out.last().existed is False
    with pytest.raises(NotFound, match="realtime session s not found"):
        submit(engine, "s", 3, out)


def test_unknown_session_chunk_is_not_found(make_engine):
    engine = make_engine()
    with pytest.raises(NotFound, match="realtime session nope not found"):
        submit(engine, "nope", 1, Replies())


def test_chunk_zero_needs_an_open_and_the_open_is_answered_at_once(make_engine):
    engine = make_engine()
    with pytest.raises(NotFound, match="realtime session s not opened"):
        engine.submit(chunk("s", 0), Replies())
    out = Replies()
    engine.submit(open_session("s", **SMALL), out)
    assert out.items == [RealtimeOpened(request_id="s-open", session_id="s")]
    assert not engine.has_work() and "s" not in engine.sessions  # the state waits for chunk 0
    engine.submit(RealtimeRelease(request_id="rel", session_id="s"), out)
    assert out.last().existed is True  # an open not yet run is released too
    with pytest.raises(NotFound, match="not opened"):
        engine.submit(chunk("s", 0), Replies())


def test_settings_ride_on_the_open_only(make_engine):
    """Chunks after the open carry no settings, yet run under the open's."""
    engine = make_engine()
    out = Replies()
    engine.submit(open_session("s", seed=4, **SMALL), Replies())
    for k in range(2):
        engine.submit(chunk("s", k), out)
        engine.step()
    assert [r.width for r in out.items] == [32, 32]
    assert frames_of(out.items) == frames_of(run_session(make_engine(), "t", 2, seed=4, **SMALL))


def test_chunk_zero_resets_the_session(make_engine):
    engine = make_engine()
    first = frames_of(run_session(engine, "s", 2, seed=3, **SMALL))
    again = frames_of(run_session(engine, "s", 2, seed=3, **SMALL))
    assert again == first
    assert engine.sessions.get("s").next_chunk == 2


@pytest.mark.parametrize("fields,pattern", [
    (dict(sink_size=-1), "sink size must be >= 0"),
    (dict(window_frames=0), "window"),
    (dict(sink_size=3, window_frames=5), r"window \(5 latent frames\)"),
    (dict(window_frames=2000), "<= 1024"),
    (dict(width=40), "width must be a multiple of 16"),
    (dict(height=4096), "height must be a multiple of 16"),
    (dict(num_inference_steps=99), "num_inference_steps"),
    (dict(guidance_scale=5.0), "guidance_scale"),
    (dict(camera=[["x"]]), "unknown camera key"),
    (dict(camera=[["w"]] * 13), "at most 12"),
])
def test_invalid_settings_are_invalid_request(make_engine, fields, pattern):
    engine = make_engine()
    out = Replies()
    if "camera" in fields:  # camera is checked when the chunk runs
        submit(engine, "s", 0, out, **SMALL, **fields)
        engine.step()
        assert isinstance(out.last(), ErrorReply) and out.last().code == "invalid_request"
        assert re.search(pattern, out.last().message)
        return
    with pytest.raises(InvalidRequest, match=pattern):
        submit(engine, "s", 0, out, **fields)
    assert not engine.has_work()


def test_out_of_order_chunk_fails(make_engine):
    engine = make_engine()
    run_session(engine, "s", 1, **SMALL)
    out = Replies()
    submit(engine, "s", 3, out)
    engine.step()
    assert isinstance(out.last(), ErrorReply) and "expects chunk 1, got 3" in out.last().message


def test_camera_and_prompt_condition_the_frames(make_engine):
    def run(**later):
        engine = make_engine()
        replies = run_session(engine, "s", 1, seed=1, **SMALL)
        out = Replies()
        submit(engine, "s", 1, out, **later)
        engine.step()
        return replies[0].frames, out.last().frames

    base0, base1 = run()
    cam0, cam1 = run(camera=[["w", "d"]] * 12)
    new0, new1 = run(prompt="a blue cup on a street")
    assert cam0 == base0 and new0 == base0
    assert cam1 != base1 and new1 != base1


def test_refresh_kv_is_reported_and_equals_no_refresh_under_the_same_prompt(make_engine):
    def run(refresh: bool, prompt: str | None):
        engine = make_engine()
        run_session(engine, "s", 3, seed=2, **SMALL)
        out = Replies()
        submit(engine, "s", 3, out, prompt=prompt, refresh_kv=refresh)
        engine.step()
        return out.last()

    plain, refreshed = run(False, None), run(True, None)
    assert plain.kv_refresh_ms is None and refreshed.kv_refresh_ms > 0
    a = torch.frombuffer(bytearray(plain.frames), dtype=torch.uint8).int()
    b = torch.frombuffer(bytearray(refreshed.frames), dtype=torch.uint8).int()
    assert (a - b).abs().max().item() <= 1  # same K/V recomputed: equal up to rounding
    switched, switched_refreshed = run(False, "a blue cup"), run(True, "a blue cup")
    assert switched_refreshed.kv_refresh_ms > 0 and switched.frames != switched_refreshed.frames


def test_positions_are_rebased_before_the_rope_range(rt_model):
    small_range = dataclasses.replace(rt_model.dit.cfg, max_rope_frames=12)
    dit = type(rt_model.dit)(small_range)
    dit.load_state_dict(rt_model.dit.state_dict())
    model = RealtimeModel(rt_model.config, dit, rt_model.vae, rt_model.text_encoder,
                          rt_model.tokenizer)
    engine = RealtimeEngine(RealtimeStageConfig(), ServerConfig(), runner=CausalRunner(model))
    replies = run_session(engine, "s", 8, sink_size=3, window_frames=9, **SMALL)
    session = engine.sessions.get("s")
    assert all(isinstance(r, RealtimeChunkResult) for r in replies)
    rebased = [r.chunk_index for r in replies if r.kv_refresh_ms is not None]
    assert rebased, "a re-base should have run"
    assert session.next_position <= 12 and session.next_frame == 24
    positions = [f.position for f in session.cache.frames]
    assert positions == sorted(positions) and max(positions) < 12


def test_session_table_is_bounded_lru(make_engine):
    engine = make_engine(max_sessions=1, session_table_margin=1)
    for sid in ("a", "b"):
        run_session(engine, sid, 1, **SMALL)
    out = Replies()
    engine.submit(chunk("a", 1), out)  # touch "a": "b" is now least recently used
    engine.step()
    run_session(engine, "c", 1, **SMALL)
    assert "b" not in engine.sessions and "a" in engine.sessions and "c" in engine.sessions


def test_server_warmup_runs_and_leaves_no_session(make_engine):
    engine = make_engine(warmup_mode="server", warmup_sizes=["32x32", "48x32"])
    assert engine.state() == "ready" and len(engine.sessions) == 0 and not engine.has_work()
    with pytest.raises(InvalidRequest, match="width must be a multiple"):
        make_engine(warmup_mode="server", warmup_sizes=["40x32"])


def test_cancel_drops_a_queued_chunk(make_engine):
    engine = make_engine()
    run_session(engine, "s", 1, **SMALL)
    out = Replies()
    submit(engine, "s", 1, out, tag="x")
    engine.cancel("s-1-x")
    assert not engine.has_work()
    engine.step()
    assert out.items == []
    engine.submit(chunk("s", 1), out)  # the same chunk index can be sent again
    engine.step()
    assert isinstance(out.last(), RealtimeChunkResult) and out.last().chunk_index == 1
