"""`Retry-After` on shed 503s: the `SlotClock` estimate (api/retry_after.py), and its wiring at
each admission point: live reasoning session slots (the fake reasoner's C1), native media
requests in flight (the sleep generation engine), realtime session slots."""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator

import httpx
import pytest

from worldserve.api.app import create_app
from worldserve.api.realtime.admission import AdmissionManager, AdmissionRejected
from worldserve.api.retry_after import SlotClock, header_value
from worldserve.api.runtime import ServerRuntime
from worldserve.cluster.fake import STEP_S, SleepGenerationEngine
from worldserve.config import ServerConfig
from worldserve.engines.reasoner.fake import FakeReasonerEngine
from worldserve.runtime.inprocess import InProcessStageClient


def test_the_oldest_slot_frees_at_the_mean_hold_time() -> None:
    clock = SlotClock(floor_s=1.0, ceiling_s=60.0)
    assert clock.retry_after_s(now_s=0.0) == 1.0  # nothing held, nothing measured
    first = clock.hold(now_s=0.0)
    clock.release(first, now_s=10.0)  # one 10 s hold measured
    clock.hold(now_s=20.0)
    clock.hold(now_s=23.0)
    assert clock.retry_after_s(now_s=24.0) == pytest.approx(6.0)  # oldest is 4 s into ~10 s
    assert clock.retry_after_s(3.0, now_s=24.0) == pytest.approx(3.0)  # a sooner known expiry
    assert clock.retry_after_s(now_s=40.0) == 1.0  # overdue: the floor
    unmeasured = clock.hold(now_s=40.0)
    clock.release(unmeasured, measured=False, now_s=100.0)
    assert clock.mean_hold_s == pytest.approx(10.0)  # a 60 s unmeasured hold changed nothing
    assert SlotClock(ceiling_s=5.0).retry_after_s(900.0) == 5.0
    assert [header_value(s) for s in (0.2, 1.0, 1.01, 29.5)] == ["1", "1", "2", "30"]


async def serve(config: ServerConfig, clients: dict) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(ServerRuntime(config=config, clients=clients))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        yield c
    for client in clients.values():
        await client.close()


async def test_session_slots_exhausted_says_when_the_idle_session_expires() -> None:
    config = ServerConfig.model_validate({"stages": {
        "generation": {"enabled": False},
        "reasoner": {"backend": "fake",
                     "streaming": {"max_sessions": 1, "rest_idle_timeout_s": 30}}}})
    engine = FakeReasonerEngine(config.stages.reasoner, config)
    async for http in serve(config, {"reasoner": InProcessStageClient("reasoner", engine)}):
        first = await http.post("/v1/streaming/sessions", json={"system_prompt": "x"})
        assert first.status_code == 201, first.text
        shed = await http.post("/v1/streaming/sessions", json={"system_prompt": "x"})
        assert shed.status_code == 503 and "session slots exhausted" in shed.text
        # the only slot frees when the idle REST session reaches its 30 s idle timeout
        assert 28 <= int(shed.headers["Retry-After"]) <= 30
        await http.delete(f"/v1/streaming/sessions/{first.json()['session_id']}")
        again = await http.post("/v1/streaming/sessions", json={"system_prompt": "x"})
        assert again.status_code == 201


async def test_native_requests_in_flight_say_when_the_running_job_should_end(
        tmp_path) -> None:
    num_steps = 30  # a job holds its slot about num_steps × STEP_S = 1.5 s
    config = ServerConfig.model_validate({"stages": {
        "generation": {"model_path": str(tmp_path), "output_dir": str(tmp_path / "out"),
                       "max_in_flight": 1},
        "reasoner": {"enabled": False}}})
    engine = SleepGenerationEngine(config.stages.generation, config)
    video = {"prompt": "p", "num_inference_steps": num_steps}
    async for http in serve(config, {"generation": InProcessStageClient("generation", engine)}):
        first = (await http.post("/v1/videos", json=video)).json()
        shed = await http.post("/v1/videos", json=video)
        assert shed.status_code == 503 and shed.headers["Retry-After"] == "1"  # nothing measured
        while (await http.get(f"/v1/videos/{first['id']}")).json()["status"] != "completed":
            await asyncio.sleep(0.05)
        second = await http.post("/v1/videos", json=video)
        assert second.status_code == 200
        shed = await http.post("/v1/videos", json=video)
        # the measured job took >= 1.5 s and the running one has just started
        assert shed.status_code == 503 and shed.headers["Retry-After"] == "2"
        assert num_steps * STEP_S > 1.0


async def test_realtime_admission_rejection_carries_the_estimate() -> None:
    manager = AdmissionManager(max_sessions=1, max_sessions_per_user=0, wait_s=0.05)
    held = await manager.acquire("a")
    await asyncio.sleep(1.3)
    await manager.release(held)  # a 1.3 s session measured
    await manager.acquire("b")
    started = time.monotonic()
    with pytest.raises(AdmissionRejected) as rejected:
        await manager.acquire("c")
    waited = time.monotonic() - started
    assert rejected.value.retry_after_s == pytest.approx(1.3 - waited, abs=0.15)
