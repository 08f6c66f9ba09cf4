"""vLLM-Omni realtime mapping pieces and the cadence tracker, without a server."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from worldserve.api.metrics import RealtimeCadenceMetrics
from worldserve.api.realtime.cadence import CadenceTracker
from worldserve.api.realtime.omni_mapping import latent_spans, se3_velocity_keys
from worldserve.api.realtime.omni_messages import InvalidMessage, parse_session_start


def test_latent_spans_follow_the_causal_first_block_then_split_evenly():
    assert latent_spans(9, 3, 4) == [1, 4, 4]
    assert latent_spans(12, 3, 4) == [4, 4, 4]
    assert latent_spans(10, 3, 4) == [4, 3, 3]


@pytest.mark.parametrize("translation, rotation, keys", [
    ([0, 0, 0.05], [0, 0, 0, 1], ["w"]),
    ([-0.05, 0, -0.05], [0, 0, 0, 1], ["a", "s"]),
    ([0, 0, 0], [0.03, 0, 0, 0.99], ["i"]),
    ([0, 0, 0], [0, -0.05, 0, 0.99], ["j"]),
    ([0, 0, 0], [0, 0, 0, 1], []),
])
def test_se3_velocity_maps_to_held_keys_by_sign(translation, rotation, keys):
    data = {"translation": translation, "rotation": rotation}
    assert se3_velocity_keys(data, "camera.data") == keys


def test_sampling_params_fold_into_the_request_as_vllm_omni_does():
    start = parse_session_start({"type": "session.start", "prompt": "p", "seed": 1,
                                 "sampling_params": {"seed": 2, "fps": 8}})
    assert (start.seed, start.fps) == (1, 8)
    with pytest.raises(InvalidMessage) as err:
        parse_session_start({"type": "session.start", "prompt": "p",
                             "sampling_params": {"flow_shift": 3.0}})
    assert err.value.param == "flow_shift"



def _value(registry: CollectorRegistry, name: str) -> float:
    for family in registry.collect():
        for s in family.samples:
            if s.name == name:
                return s.value
    return 0.0


def test_cadence_counts_a_stall_only_when_the_delivered_media_ran_out():
    registry = CollectorRegistry()
    metrics = RealtimeCadenceMetrics(registry)
    tracker = CadenceTracker("vllm_omni", fps=10, metrics=metrics, started_at=0.0)
    tracker.chunk_sent(10, now=0.5)  # first chunk: 1 s of media, 0.5 s after the start
    tracker.chunk_sent(10, now=1.4)  # 0.9 s later: within the 1 s buffered, no stall
    tracker.chunk_sent(10, now=3.0)  # 2.5 s played of 2 s delivered: a stall
    tracker.chunk_sent(10, now=3.5)  # playback restarted at 3.0 with 1 s: fine
    assert _value(registry, "worldserve_realtime_first_chunk_seconds_sum") == 0.5
    assert _value(registry, "worldserve_realtime_chunk_interval_seconds_count") == 3
    assert _value(registry, "worldserve_realtime_stalls_total") == 1
    factor_sum = _value(registry, "worldserve_realtime_factor_sum")
    assert factor_sum == pytest.approx(1 / 0.9 + 1 / 1.6 + 1 / 0.5)
