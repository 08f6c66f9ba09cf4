"""Admission slots and init schema rules (spec §3.1, §7), pure CPU."""

from __future__ import annotations

import asyncio
import re
import time

import pytest
from pydantic import ValidationError

from worldserve.api.realtime.admission import (
    CAPACITY_EXHAUSTED,
    USER_SESSION_LIMIT,
    AdmissionManager,
    AdmissionRejected,
)
from worldserve.api.realtime.sender import Pacer
from worldserve.api.schemas.realtime import InitRequest, parse_size


async def test_waiter_admitted_when_a_slot_frees():
    manager = AdmissionManager(max_sessions=1, max_sessions_per_user=0, wait_s=2.0)
    first = await manager.acquire("a")
    waiter = asyncio.create_task(manager.acquire("b"))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    await manager.release(first)
    lease = await asyncio.wait_for(waiter, 1.0)
    assert lease.user == "b" and manager.num_active == 1
    await manager.release(lease)
    await manager.release(lease)  # idempotent
    assert manager.num_active == 0


async def test_capacity_exhausted_after_wait():
    manager = AdmissionManager(max_sessions=1, max_sessions_per_user=0, wait_s=0.2)
    await manager.acquire("a")
    started = time.monotonic()
    with pytest.raises(AdmissionRejected) as info:
        await manager.acquire("b")
    assert info.value.reason == CAPACITY_EXHAUSTED and info.value.retry_after_s
    assert time.monotonic() - started >= 0.19


async def test_per_user_limit_rejects_at_once():
    manager = AdmissionManager(max_sessions=4, max_sessions_per_user=1, wait_s=5.0)
    await manager.acquire("a")
    with pytest.raises(AdmissionRejected) as info:
        await manager.acquire("a")
    assert info.value.reason == USER_SESSION_LIMIT
    await manager.acquire("b")


async def test_kv_budget_bounds_sessions():
    manager = AdmissionManager(max_sessions=8, max_sessions_per_user=0, wait_s=0.1,
                               kv_budget_bytes=100)
    first = await manager.acquire("a", kv_bytes=60)
    with pytest.raises(AdmissionRejected) as info:
        await manager.acquire("b", kv_bytes=50)  # 110 > 100: waits, then rejected
    assert info.value.reason == CAPACITY_EXHAUSTED
    await manager.acquire("b", kv_bytes=40)
    assert manager.kv_bytes_in_use == 100
    with pytest.raises(AdmissionRejected, match="whole budget"):
        await manager.acquire("c", kv_bytes=101)  # never fits: no waiting
    await manager.release(first)
    await manager.acquire("c", kv_bytes=60)


def test_init_accepts_unknown_keys_and_refuses_server_paths():
    init = InitRequest.model_validate({"type": "init", "prompt": "p", "adapter_extra": [1]})
    assert init.output_format == "raw" and init.seed == 42
    for key in ("output_path", "perf_dump_path", "vae_model_path", "model_path"):
        with pytest.raises(ValidationError, match=key):
            InitRequest.model_validate({"type": "init", "prompt": "p", key: "/etc"})


@pytest.mark.parametrize("extra", [
    {"prompt": ""}, {"size": "832"}, {"size": "0x480"}, {"max_chunks": 0},
    {"realtime_output_format": "png"}, {"realtime_delta_level": 3},
    {"realtime_output_format": "delta-gzip", "realtime_delta_level": 10},
    {"realtime_output_format": "delta-zstd", "realtime_delta_level": 0},
    {"output_compression": 101}, {"realtime_causal_sink_size": -1},
    {"condition_inputs": {"action": "w-1", "camera_actions": [["w"]]}},
    {"condition_inputs": {"intrinsics_path": "/tmp/k.npy"}},
    {"enable_frame_interpolation": True}, {"prompt": b"bytes"},
])
def test_invalid_inits(extra):
    with pytest.raises(ValidationError):
        InitRequest.model_validate({"type": "init", "prompt": "p", **extra})


def test_size_parsing():
    assert parse_size("832x480") == (832, 480)
    assert parse_size(" 64X32 ") == (64, 32)


async def test_pacer_spaces_chunks_and_event_resets_clock():
    pacer = Pacer(fps_out=100.0)  # 10 frames -> 100 ms
    assert await pacer.wait(None) == 0.0
    pacer.sent(time.monotonic(), 10)
    waited = await pacer.wait(None)
    assert 0.05 < waited <= 0.1
    pacer.sent(time.monotonic(), 10)
    assert await pacer.wait(7) == 0.0  # a new event id is never held back


CAUSAL_CAPS = {"pipeline": "CausalWan", "realtime_supported": True, "frames_per_chunk": 12,
               "first_chunk_frames": 9, "latent_frames_per_block": 3, "default_sink_frames": 3,
               "default_window_frames": 12, "max_window_frames": 64, "max_inference_steps": 16,
               "supports_guidance": False, "size_multiple": 16, "camera_conditioning": True}


@pytest.mark.parametrize("extra,field", [
    ({"realtime_causal_sink_size": 10}, "window 12 must be >= sink (10)"),
    ({"realtime_causal_kv_cache_num_frames": 5}, "window 5 must be >= sink (3)"),
    ({"realtime_causal_kv_cache_num_frames": 65}, "exceeds 64"),
    ({"num_inference_steps": 17}, "num_inference_steps"),
    ({"guidance_scale": 3.0}, "guidance-distilled"),
    ({"guidance_scale": 0.5}, "guidance_scale must be >= 1.0"),
])
def test_engine_limits(extra, field):
    from worldserve.api.realtime.service import _check_model_limits
    from worldserve.errors import InvalidRequest
    from worldserve.ipc.capabilities import RealtimeCapabilities

    facts = RealtimeCapabilities(**CAUSAL_CAPS, kv_bytes_per_token=10)
    assert facts.frames_in_chunk(0) == 9 and facts.frames_in_chunk(1) == 12
    assert facts.kv_bytes(64, 32, None) == 10 * 12 * (4 * 2)
    _check_model_limits(InitRequest.model_validate({"type": "init", "prompt": "p"}), facts)
    with pytest.raises(InvalidRequest, match=re.escape(field)):
        _check_model_limits(InitRequest.model_validate({"type": "init", "prompt": "p", **extra}),
                            facts)
