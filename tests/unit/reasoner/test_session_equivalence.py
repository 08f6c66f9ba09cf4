"""A session's cached replies equal independent recomputations (spec 11-12, cpu-stack 7)."""

from __future__ import annotations

from tests.unit.reasoner.conftest import GREEDY
from tests.unit.reasoner.reference import MaskedReference, full_recompute_check
from tests.unit.reasoner.tiny_vlm import frame_bytes


def test_replies_equal_recompute_without_eviction(make_engine):
    drv = make_engine()
    drv.create(retention={"max_video_segments": 16}, sampling={"max_tokens": 6, **GREEDY})
    session = drv.engine.sessions["s1"]
    ref = MaskedReference(drv.engine.model)
    for i in range(6):
        result = drv.frame("s1", frame_bytes(i, size=56 + 28 * (i % 3)))
        assert result.frame_index == i and result.evicted_segments == 0
        ref.follow(session)
    assert all(ref.alive)


def test_replies_equal_masked_reference_across_evictions(make_engine):
    drv = make_engine()
    drv.create(retention={"max_video_segments": 2, "max_text_tokens": 12},
               sampling={"max_tokens": 5, **GREEDY})
    session = drv.engine.sessions["s1"]
    ref = MaskedReference(drv.engine.model)
    evicted = 0
    for i in range(12):
        result = drv.frame("s1", frame_bytes(i))
        evicted += result.evicted_segments
        ref.follow(session)
        videos = [s for s in session.segments if s.kind == "video"]
        assert len(videos) <= 2
        assert session.segments[0].kind == "system_prompt" and session.segments[0].pinned
        assert result.session_tokens == len(session.kv.ids)
    assert evicted >= 10  # video and text caps both fired
    assert not all(ref.alive)
    # positions are never rewritten: the retained positions have gaps and stay increasing
    axis_max = session.kv.positions.max(0).values
    assert int(axis_max.max()) + 1 == session.kv.next_pos
    assert len(session.kv) < session.kv.next_pos


def test_reprefill_equals_fresh_prompt_and_bounds_positions(make_engine):
    drv = make_engine()
    drv.create(retention={"max_video_segments": 3, "reprefill_threshold": 0.55,
                         "max_session_tokens": 1024},
               sampling={"max_tokens": 8, **GREEDY})
    session = drv.engine.sessions["s1"]
    limit = 0.55 * drv.engine.model_limits.max_position_embeddings
    reprefills = 0
    for i in range(60):
        result = drv.frame("s1", frame_bytes(i, size=112))
        assert session.kv.max_position < drv.engine.model_limits.max_position_embeddings
        if result.reprefill_ms is not None:
            reprefills += 1
            assert result.engine_ms >= result.reprefill_ms
            full_recompute_check(drv.engine.model, session)
            assert session.kv.max_position < limit
    assert reprefills >= 1


def test_qwen3_vl_session_equals_masked_reference(make_engine, tiny_qwen3_dir):
    drv = make_engine(tiny_qwen3_dir)
    drv.create(retention={"max_video_segments": 1}, sampling={"max_tokens": 4, **GREEDY})
    session = drv.engine.sessions["s1"]
    ref = MaskedReference(drv.engine.model)
    for i in range(4):
        drv.frame("s1", frame_bytes(i, size=64))
        ref.follow(session)
    assert not all(ref.alive)
