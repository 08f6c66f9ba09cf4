"""Engine behaviour: admission, session lifecycle, bad input, scheduling, chat, long sessions."""

from __future__ import annotations

import time

import pytest

from tests.unit.reasoner.conftest import GREEDY
from tests.unit.reasoner.drive import concurrent_replies
from tests.unit.reasoner.tiny_vlm import frame_bytes
from worldserve.engines.reasoner import admission
from worldserve.errors import CapacityExceeded, Conflict, InvalidRequest, NotFound
from worldserve.ipc.messages import (
    ChatCompletion,
    ChatDelta,
    ChatMessage,
    ChatPart,
    ChatResult,
    CloseSession,
    ReasonerSampling,
    SessionClosed,
    SessionFrame,
)


def test_capabilities_describe_model_defaults_and_limits(make_engine):
    caps = make_engine().engine.capabilities()
    assert caps.backend == "hf" and caps.dtype == "float32"
    assert caps.max_model_len == caps.max_position_embeddings == 2048
    assert caps.retention.max_video_segments == 8
    assert caps.image_budget == 32 and caps.encoder_capacity == 32
    assert caps.max_sessions == 2
    assert caps.sampling.max_tokens == 24
    # the server policy passes its own admission rules on this small model
    model = admission.ModelLimits(2048, 2048)
    limits = admission.StreamingLimits(2, 32, 32)
    admission.check_retention(caps.retention, ReasonerSampling(),
                              model, limits)
    # a supplied object is built from the library defaults: 30 frames fail A3 (spec 4.2)
    library = caps.library_retention
    assert library.max_video_segments == 30
    with pytest.raises(InvalidRequest, match="needs 60 image slots"):
        admission.check_retention(library, ReasonerSampling(), model, limits)


@pytest.mark.parametrize("retention, sampling, message", [
    ({"max_session_tokens": 2040}, {"max_tokens": 24},
     r"max_session_tokens \+ max_tokens \(2064\) must be below the model context length \(2048\)"),
    ({"max_session_tokens": 1500}, {},
     r"max_session_tokens \(1500\) must be below reprefill_threshold × max_position_embeddings "
     r"\(1433.6\)"),
    ({"max_video_segments": 17}, {}, r"retention window needs 34 image slots; the limit is 32"),
])
def test_admission_inequalities_are_400(make_engine, retention, sampling, message):
    drv = make_engine()
    with pytest.raises(InvalidRequest, match=message):
        drv.create(retention=retention, sampling=sampling)


def test_capacity_rules_are_503_and_freed_by_close(make_engine):
    drv = make_engine()
    drv.create("a")
    drv.create("b")
    with pytest.raises(CapacityExceeded, match=r"session slots exhausted \(2/2\)"):
        drv.create("c")
    drv.call(CloseSession(request_id="x", session_id="b"))
    drv.call(CloseSession(request_id="y", session_id="a"))
    drv.create("big", retention={"max_video_segments": 12})
    with pytest.raises(CapacityExceeded,
                       match=r"shared encoder capacity exhausted \(24\+10 > 32\)"):
        drv.create("d", retention={"max_video_segments": 5})
    drv.create("e", retention={"max_video_segments": 4})


def test_corrupt_image_is_400_and_session_unchanged(make_engine):
    drv = make_engine()
    drv.create(sampling={"max_tokens": 4, **GREEDY})
    drv.frame("s1", frame_bytes(0))
    session = drv.engine.sessions["s1"]
    before = (list(session.kv.ids), session.frames, len(session.segments))
    for bad in (b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, frame_bytes(1)[:40], b"GIF89a....",
                frame_bytes(1, fmt="JPEG")[:200]):
        with pytest.raises(InvalidRequest):
            drv.frame("s1", bad)
        assert (list(session.kv.ids), session.frames, len(session.segments)) == before
    assert drv.frame("s1", frame_bytes(2, fmt="JPEG")).frame_index == 1


def test_frame_that_does_not_fit_is_400_and_session_stays_usable(make_engine):
    drv = make_engine()
    prompts = drv.engine.prompts
    system = "robot arm " * 10

    def anchor_len(text):
        return len(prompts.frame_chunk(frame_bytes(0, size=28), text, "", None, set()).turn_ids)

    while anchor_len(system) < 2048 - 40:
        system += "cup " * max(1, (2048 - 40 - anchor_len(system)) // 3)
    drv.create(system_prompt=system, question="", retention={"max_session_tokens": 1024},
               sampling={"max_tokens": 4, **GREEDY})
    drv.frame("s1", frame_bytes(0, size=28))
    session = drv.engine.sessions["s1"]
    ids = list(session.kv.ids)
    with pytest.raises(InvalidRequest, match="frame does not fit in the session context"):
        drv.frame("s1", frame_bytes(1, size=224))
    assert session.kv.ids == ids and session.frames == 1
    assert drv.frame("s1", frame_bytes(2, size=28)).frame_index == 1


def test_unknown_busy_cancel_and_close(make_engine):
    drv = make_engine(max_sessions=1)
    with pytest.raises(NotFound):
        drv.frame("nope", frame_bytes(0))
    drv.create(sampling={"max_tokens": 8, **GREEDY})
    drv.frame("s1", frame_bytes(0))
    drv.submit(SessionFrame(request_id="f1", session_id="s1", image=frame_bytes(1),
                            received_at=time.time()))
    with pytest.raises(Conflict, match="session busy"):
        drv.engine.submit(SessionFrame(request_id="f2", session_id="s1", image=frame_bytes(2),
                                       received_at=time.time()), drv.replies.append)
    drv.engine.step()
    drv.engine.cancel("f1")
    assert not drv.engine.has_work()
    assert drv.engine.sessions["s1"].kv is None  # cache released at once
    with pytest.raises(Conflict, match="no longer usable"):
        drv.frame("s1", frame_bytes(3))
    drv.create("s2")  # a dead session does not hold a slot
    closed = drv.call(CloseSession(request_id="c", session_id="s1"))
    assert isinstance(closed, SessionClosed) and closed.frames == 1
    with pytest.raises(NotFound):
        drv.call(CloseSession(request_id="c2", session_id="s1"))


@pytest.mark.parametrize("batching", [False, True])
def test_round_robin_never_runs_one_job_twice_while_others_wait(make_engine, batching):
    """Unbatched: strict rotation. Batched: every decode step advances all decoding jobs at
    once, so a job waiting to prefill is next after at most one step."""
    drv = make_engine(max_sessions=3)
    drv.engine.scheduler.batch_decode = batching
    for sid in ("a", "b"):
        drv.create(sid, sampling={"max_tokens": 6, **GREEDY})
    for sid, i in (("a", 0), ("b", 1)):
        drv.submit(SessionFrame(request_id=f"{sid}-f", session_id=sid, image=frame_bytes(i),
                                received_at=time.time()))
    drv.submit(ChatCompletion(request_id="chat", sampling=ReasonerSampling(max_tokens=6),
                              messages=[ChatMessage(role="user",
                                                    parts=[ChatPart(type="text", text="hi")])]))
    order = []
    while drv.engine.has_work():
        jobs = list(drv.engine.scheduler)
        decoding = sum(j.phase.value == "decode" for j in jobs)
        order.append((jobs[0].request_id, len(jobs), decoding))
        drv.engine.step()
    for (prev, n_prev, d_prev), (cur, _, _) in zip(order, order[1:]):
        batched_all = batching and d_prev == n_prev
        assert not (prev == cur and n_prev > 1 and not batched_all), order
    done = [r.request_id for r in drv.replies
            if getattr(r, "terminal", True) and not r.request_id.startswith("create")]
    assert sorted(done) == ["a-f", "b-f", "chat"]


def test_chat_completion_streams_deltas_then_result(make_engine):
    drv = make_engine()
    request = ChatCompletion(
        request_id="chat", stream=True,
        sampling=ReasonerSampling(max_tokens=12, temperature=0.9, seed=1, stop=["zz"]),
        messages=[ChatMessage(role="system", parts=[ChatPart(type="text", text="Be brief.")]),
                  ChatMessage(role="user", parts=[ChatPart(type="image", image=frame_bytes(0)),
                                                  ChatPart(type="image", image=frame_bytes(1)),
                                                  ChatPart(type="text", text="Compare.")])])
    result = drv.call(request)
    deltas = [r.text for r in drv.replies if isinstance(r, ChatDelta)]
    assert isinstance(result, ChatResult)
    assert "".join(deltas) == result.text
    assert 0 < result.completion_tokens <= 12 and result.prompt_tokens > 8
    guided = drv.call(ChatCompletion(
        request_id="chat2", sampling=ReasonerSampling(max_tokens=12, guided_choice=["yes", "no"]),
        messages=[ChatMessage(role="user", parts=[ChatPart(type="text", text="ok?")])]))
    assert guided.text in ("yes", "no") and guided.finish_reason == "stop"
    with pytest.raises(InvalidRequest):
        drv.call(ChatCompletion(request_id="bad", sampling=ReasonerSampling(),
                                messages=[ChatMessage(role="user", parts=[
                                    ChatPart(type="image", image=b"junk")])]))


def test_frame_result_timings(make_engine):
    drv = make_engine()
    drv.create(sampling={"max_tokens": 4, **GREEDY})
    result = drv.frame("s1", frame_bytes(0, fmt="JPEG"))
    assert result.decode_ms > 0 and result.build_ms > 0 and result.engine_ms > 0
    assert result.inqueue_ms >= 0 and result.latency_s > 0
    assert result.token_count == 4 and result.finish_reason == "length"
    assert result.session_tokens == len(drv.engine.sessions["s1"].kv.ids)


def test_thousand_frame_session_stays_bounded(make_engine):
    """1,000 small frames: the cache stays under the session bound, replies keep coming."""
    drv = make_engine()
    window, cap = 4, 1024
    drv.create(retention={"max_video_segments": window, "max_session_tokens": cap},
               sampling={"max_tokens": 2, **GREEDY})
    session = drv.engine.sessions["s1"]
    frames = [frame_bytes(i, size=28) for i in range(10)]
    limit = 0.7 * 2048
    reprefills = evicted = 0
    for i in range(1000):
        result = drv.frame("s1", frames[i % 10])
        assert result.frame_index == i
        reprefills += result.reprefill_ms is not None
        evicted += result.evicted_segments
        assert len(session.kv) <= cap + 2
        assert session.kv.max_position < limit + 64
        assert sum(s.kind == "video" for s in session.segments) <= window
    assert reprefills >= 3 and evicted > 1000


@pytest.mark.parametrize("spec", ["none", "ngram"])
def test_batched_decode_equals_sequential(make_engine, spec):
    """Decode steps of concurrent sessions (with their n-gram drafts) share one forward and
    give the same tokens as running them one by one without speculation."""
    sampling = {"max_tokens": 10, "temperature": 0.8, "seed": 11, "repetition_penalty": 1.2}
    batched = make_engine(max_sessions=3, spec_method=spec, spec_num_tokens=3)
    sequential = make_engine(max_sessions=3)
    sequential.engine.scheduler.batch_decode = False
    got = concurrent_replies(batched, sampling)
    expected = concurrent_replies(sequential, sampling)
    assert got == expected
    assert batched.engine.runner.num_forwards < sequential.engine.runner.num_forwards


def test_close_during_a_frame_answers_the_frame_with_409(make_engine):
    drv = make_engine()
    drv.create(sampling={"max_tokens": 8, **GREEDY})
    drv.submit(SessionFrame(request_id="f", session_id="s1", image=frame_bytes(0),
                            received_at=time.time()))
    drv.engine.step()
    drv.submit(CloseSession(request_id="c", session_id="s1"))
    closed = drv.replies[-1]
    assert isinstance(closed, SessionClosed) and closed.frames == 0
    assert not drv.engine.has_work()
    frame_reply = [r for r in drv.replies if r.request_id == "f"]
    assert len(frame_reply) == 1 and frame_reply[0].code == "conflict"
    assert frame_reply[0].message == "session was closed"


def test_engine_failure_kills_the_session_not_the_engine(make_engine):
    drv = make_engine()
    drv.create("a", sampling={"max_tokens": 4, **GREEDY})
    drv.create("b", sampling={"max_tokens": 4, **GREEDY})
    drv.frame("a", frame_bytes(0))
    runner = drv.engine.runner
    original = runner.forward

    def broken(*args, **kwargs):
        raise RuntimeError("device lost")

    runner.forward = broken  # the model boundary fails mid-frame
    with pytest.raises(Exception, match="engine failure: device lost") as info:
        drv.frame("a", frame_bytes(1))
    assert info.value.code == "internal_error"
    runner.forward = original
    with pytest.raises(Conflict, match="no longer usable"):
        drv.frame("a", frame_bytes(2))
    assert drv.frame("b", frame_bytes(3)).frame_index == 0  # other sessions carry on
    assert drv.call(CloseSession(request_id="c", session_id="a")).frames == 1


def test_streaming_disabled_refuses_sessions(make_engine):
    from worldserve.errors import NotSupported

    drv = make_engine(enabled=False)
    assert drv.engine.capabilities().streaming is False
    with pytest.raises(NotSupported):
        drv.create()


def test_server_policy_that_can_never_fit_is_a_startup_error(make_engine):
    from worldserve.engines.common import ModelLoadError

    with pytest.raises(ModelLoadError, match="stages.reasoner.streaming.*max_session_tokens"):
        make_engine(max_session_tokens=4000)
