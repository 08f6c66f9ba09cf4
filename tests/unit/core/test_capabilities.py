"""Typed stage capabilities: each kind survives the wire, defaults come from one place."""

from __future__ import annotations

import msgspec
import pytest

from worldserve.ipc.capabilities import (
    ActionHeadCapabilities,
    GenerationCapabilities,
    RealtimeCapabilities,
    ReasonerCapabilities,
    capabilities_as,
)
from worldserve.ipc.codec import MessageCodec
from worldserve.ipc.messages import ReasonerRetention, StageInfo

ACTIONS = ActionHeadCapabilities(action_horizon=8, action_dim=7, state_dim=7, image_size=32,
                                 max_images=2, num_inference_steps=4, max_candidates=4)


def info(caps: object) -> StageInfo:
    return StageInfo(request_id="h", stage="s", pid=1, state="ready", model="m", model_path="/m",
                     num_params=0, capabilities=caps)  # type: ignore[arg-type]


@pytest.mark.parametrize("caps", [
    GenerationCapabilities(pipeline="WanPipeline", actions=ACTIONS),
    GenerationCapabilities(),
    ReasonerCapabilities(streaming=True, retention=ReasonerRetention(max_video_segments=4),
                         library_retention=ReasonerRetention()),
    RealtimeCapabilities(realtime_supported=True, first_chunk_frames=9),
    None,
])
def test_each_kind_round_trips_as_its_own_type(caps: object) -> None:
    codec = MessageCodec()
    decoded = codec.decode(codec.encode(info(caps)))
    assert isinstance(decoded, StageInfo)
    assert decoded.capabilities == caps and type(decoded.capabilities) is type(caps)


def test_a_field_an_older_api_does_not_know_is_ignored() -> None:
    raw = msgspec.msgpack.encode({"kind": "realtime", "frames_per_chunk": 6, "supports_sound": 1})
    assert msgspec.msgpack.decode(raw, type=RealtimeCapabilities).frames_per_chunk == 6


def test_missing_capabilities_read_as_the_declared_defaults() -> None:
    facts = capabilities_as(None, RealtimeCapabilities)
    assert (facts.default_width, facts.default_height, facts.frames_per_chunk) == (832, 480, 12)
    assert facts.frames_in_chunk(0) == facts.frames_in_chunk(1) == 12
    assert capabilities_as(None, GenerationCapabilities).defaults.num_frames == 81


def test_the_wrong_kind_is_an_error_not_a_silent_default() -> None:
    with pytest.raises(TypeError, match="expected RealtimeCapabilities"):
        capabilities_as(ReasonerCapabilities(), RealtimeCapabilities)


def test_kv_estimate_counts_window_and_tokens() -> None:
    facts = RealtimeCapabilities(kv_bytes_per_token=10, size_multiple=16, default_window_frames=12)
    assert facts.kv_bytes(64, 32, None) == 10 * 12 * (4 * 2)
    assert facts.kv_bytes(64, 32, 3) == 10 * 3 * (4 * 2)
