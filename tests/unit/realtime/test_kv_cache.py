"""The sink + sliding window bounds a session's cache over many chunks."""

from __future__ import annotations

import pytest

from tests.unit.realtime.helpers import Replies, submit

TPF = 4  # 32x32 frames -> 4x4 latents -> 2x2 tokens
SMALL = dict(width=32, height=32, num_inference_steps=1)


@pytest.mark.parametrize("sink,window", [(3, 9), (0, 6), (1, 4)])
def test_window_bounds_cache_tokens(make_engine, sink, window):
    engine = make_engine()
    out = Replies()
    submit(engine, "s", 0, out, sink_size=sink, window_frames=window, **SMALL)
    engine.step()
    session = engine.sessions.get("s")
    seen = []
    for k in range(1, 16):
        submit(engine, "s", k, out)
        engine.step()
        assert session.cache.num_tokens <= window * TPF
        assert session.cache.latents.shape[2] == session.cache.num_frames
        seen.append(session.cache.num_frames)
    assert max(seen) <= window and seen[-1] >= window - 2
    # the sink frames are the session's first frames, pinned
    assert [f.index for f in session.cache.frames[:sink]] == list(range(sink))
    assert session.cache.frames[-1].index == 16 * 3 - 1
    assert out.last().cached_frames == session.cache.num_frames


def test_unbounded_cache_grows(make_engine):
    engine = make_engine()
    out = Replies()
    submit(engine, "s", 0, out, sink_size=0, window_frames=1000, **SMALL)
    engine.step()
    for k in range(1, 10):
        submit(engine, "s", k, out)
        engine.step()
    assert engine.sessions.get("s").cache.num_tokens == 30 * TPF
