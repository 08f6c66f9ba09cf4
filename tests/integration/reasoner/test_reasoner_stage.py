"""The hf reasoner engine in its own stage process, driven over the real socket."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
import pytest

from tests.unit.reasoner import tiny_vlm
from worldserve.config import ServerConfig
from worldserve.errors import Conflict, InvalidRequest
from worldserve.ipc.messages import (
    Cancel,
    ChatCompletion,
    ChatDelta,
    ChatMessage,
    ChatPart,
    ChatResult,
    CloseSession,
    CreateSession,
    FrameResult,
    ReasonerSampling,
    SessionClosed,
    SessionFrame,
)
from worldserve.runtime.supervisor import Supervisor


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_vlm.build(tmp_path_factory.mktemp("reasoner-stage"))


async def test_sessions_and_chat_through_the_stage_process(model_dir: Path, monkeypatch):
    monkeypatch.setenv("WORLDSERVE_TORCH_THREADS", "1")  # tiny model: threads only contend
    config = ServerConfig.model_validate({"stages": {
        "generation": {"enabled": False}, "realtime": {"enabled": False},
        "reasoner": {"model_path": str(model_dir), "warmup_mode": "server",
                     "streaming": {"spec_method": "ngram", "max_sessions": 2}}}})
    supervisor = Supervisor(config)
    await supervisor.start()
    try:
        client = supervisor.clients["reasoner"]
        caps = client.info.capabilities
        assert caps.backend == "hf" and caps.max_model_len == 2048
        retention = msgspec.structs.replace(caps.retention, max_video_segments=2)
        sampling = ReasonerSampling(max_tokens=6, guided_choice=["clear", "hazard"])
        for sid in ("a", "b"):
            created = await client.call(CreateSession(
                request_id=f"c-{sid}", session_id=sid, system_prompt="Watch.",
                retention=retention, sampling=sampling), timeout_s=30)
            assert created.retention == retention

        async def frames(sid: str) -> list[FrameResult]:
            out = []
            for i in range(4):
                out.append(await client.call(SessionFrame(
                    request_id=f"{sid}-{i}", session_id=sid, image=tiny_vlm.frame_bytes(i),
                    received_at=time.time()), timeout_s=30))
            return out

        results = await asyncio.gather(frames("a"), frames("b"))
        for per_session in results:
            assert [r.frame_index for r in per_session] == [0, 1, 2, 3]
            assert all(r.text in ("clear", "hazard") for r in per_session)
            assert per_session[-1].evicted_segments >= 1
        with pytest.raises(InvalidRequest):
            await client.call(SessionFrame(request_id="bad", session_id="a", image=b"\x89PNG",
                                           received_at=time.time()), timeout_s=30)

        stream = await client.stream(ChatCompletion(
            request_id="chat", stream=True, sampling=ReasonerSampling(max_tokens=8, seed=3),
            messages=[ChatMessage(role="user", parts=[
                ChatPart(type="image", image=tiny_vlm.frame_bytes(9)),
                ChatPart(type="text", text="What is it?")])]))
        replies = [r async for r in stream]
        assert isinstance(replies[-1], ChatResult)
        assert "".join(r.text for r in replies if isinstance(r, ChatDelta)) == replies[-1].text

        # frame timeout path: the api cancels the frame, then closes the session
        await client.call(CloseSession(request_id="close-a", session_id="a"), timeout_s=30)
        await client.call(CreateSession(
            request_id="c-c", session_id="c", system_prompt="Watch.",
            retention=msgspec.structs.replace(caps.retention, max_session_tokens=1024),
            sampling=ReasonerSampling(max_tokens=1000, guided_regex="x{999}")), timeout_s=30)
        client.send_nowait(SessionFrame(request_id="slow", session_id="c",
                                        image=tiny_vlm.frame_bytes(5), received_at=time.time()))
        await asyncio.sleep(0.05)
        client.send_nowait(Cancel(request_id="x", target_id="slow"))
        await asyncio.sleep(0.05)  # send_nowait is a task: let it go out first
        with pytest.raises(Conflict, match="no longer usable"):
            await client.call(SessionFrame(request_id="after", session_id="c",
                                           image=tiny_vlm.frame_bytes(6),
                                           received_at=time.time()), timeout_s=30)
        closed = await client.call(CloseSession(request_id="close-c", session_id="c"), timeout_s=30)
        assert isinstance(closed, SessionClosed) and closed.frames == 0
    finally:
        await supervisor.stop()
