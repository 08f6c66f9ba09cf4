"""The fake reasoner backend, driven directly: admission, determinism, hang and cancel."""

from __future__ import annotations

import pytest

from tests.integration.streaming.support import image_bytes
from worldserve.config import ReasonerStageConfig, ServerConfig
from worldserve.engines.reasoner.fake import FakeReasonerEngine
from worldserve.errors import CapacityExceeded, InvalidRequest, NotFound
from worldserve.ipc.messages import (
    CloseSession,
    CreateSession,
    FrameResult,
    Message,
    ReasonerRetention,
    ReasonerSampling,
    SessionClosed,
    SessionCreated,
    SessionFrame,
)


def engine(**fields) -> FakeReasonerEngine:
    return FakeReasonerEngine(ReasonerStageConfig(backend="fake", **fields), ServerConfig())


def run(eng: FakeReasonerEngine, request) -> list[Message]:
    out: list[Message] = []
    eng.submit(request, out.append)
    while eng.has_work():
        eng.step()
    return out


def create(eng: FakeReasonerEngine, sid: str, window: int = 8, **sampling) -> Message:
    req = CreateSession(request_id=f"c-{sid}", session_id=sid, system_prompt="s",
                        retention=ReasonerRetention(max_video_segments=window),
                        sampling=ReasonerSampling(**sampling))
    return run(eng, req)[0]


def frame(eng: FakeReasonerEngine, sid: str, seed: int = 0, rid: str = "f") -> list[Message]:
    return run(eng, SessionFrame(request_id=rid, session_id=sid, image=image_bytes(seed=seed),
                                 received_at=0.0))


def test_capabilities_shape() -> None:
    caps = engine().capabilities()
    assert caps.retention == ReasonerRetention(max_video_segments=8)
    assert caps.sampling == ReasonerSampling()
    assert (caps.max_sessions, caps.image_budget, caps.encoder_capacity) == (2, 32, 32)
    assert caps.streaming is True and caps.backend == "fake"


def test_admission_order_and_messages() -> None:
    eng = engine()
    with pytest.raises(InvalidRequest, match="needs 60 image slots; the limit is 32"):
        create(eng, "a", window=30)
    assert isinstance(create(eng, "a", window=16), SessionCreated)
    with pytest.raises(CapacityExceeded, match=r"\(32\+16 > 32\)"):
        create(eng, "b", window=8)
    run(eng, CloseSession(request_id="x", session_id="a"))
    assert isinstance(create(eng, "b", window=8), SessionCreated)
    assert isinstance(create(eng, "c", window=8), SessionCreated)
    with pytest.raises(CapacityExceeded, match=r"session slots exhausted \(2/2\)"):
        create(eng, "d", window=1)


def test_replies_are_deterministic_and_indexed() -> None:
    eng = engine()
    create(eng, "a")
    create(eng, "b")
    first = [frame(eng, "a", seed=i)[0] for i in range(3)]
    second = [frame(eng, "b", seed=i)[0] for i in range(3)]
    assert [r.frame_index for r in first] == [0, 1, 2]
    assert [r.text for r in first] == [r.text for r in second]
    assert all(isinstance(r, FrameResult) and r.token_count >= 1 for r in first)


def test_max_tokens_and_guided_choice() -> None:
    eng = engine()
    create(eng, "a", max_tokens=1)
    reply = frame(eng, "a")[0]
    assert (reply.finish_reason, reply.token_count, len(reply.text.split())) == ("length", 1, 1)
    create(eng, "b", guided_choice=["clear", "hazard"])
    assert frame(eng, "b")[0].text in ("clear", "hazard")


def test_hung_frame_waits_until_closed() -> None:
    eng = engine(fake_hang_on_frame=0)
    create(eng, "a")
    assert frame(eng, "a") == []
    assert eng.stats()["running"] == 1
    closed = run(eng, CloseSession(request_id="x", session_id="a"))[0]
    assert isinstance(closed, SessionClosed) and closed.frames == 0
    assert eng.stats() == {"queue_depth": 0, "running": 0, "sessions": 0}


def test_frames_of_unknown_sessions_and_corrupt_images() -> None:
    eng = engine()
    with pytest.raises(NotFound):
        frame(eng, "nope")
    create(eng, "a")
    jpeg = image_bytes(size=(128, 128))
    with pytest.raises(InvalidRequest, match="invalid image"):
        run(eng, SessionFrame(request_id="f", session_id="a", image=jpeg[:200], received_at=0.0))
    assert frame(eng, "a")[0].frame_index == 0  # the bad frame did not consume an index


def test_delay_defers_replies_and_cancel_drops_them() -> None:
    eng = engine(fake_delay_ms=50)
    create(eng, "a")
    out: list[Message] = []
    eng.submit(SessionFrame(request_id="f1", session_id="a", image=image_bytes(),
                            received_at=0.0), out.append)
    assert out == [] and eng.has_work()
    eng.cancel("f1")
    assert not eng.has_work()
