"""Control queues and event validation (spec §3.2-3.5), pure CPU."""

from __future__ import annotations

import pytest

from worldserve.api.realtime.controls import MAX_PENDING_TRANSITIONS, SessionControls
from worldserve.api.realtime.events import EventApplier, InvalidEvent, parse_event
from worldserve.api.schemas.realtime import parse_action_dsl


def make(min_pulse=1, camera=True, refresh_default=False):
    controls = SessionControls(min_pulse, 512)
    return controls, EventApplier(controls, camera, 512, refresh_default)


def event(kind, payload=None, event_id=None):
    msg = {"type": "event", "kind": kind, "payload": payload}
    if event_id is not None:
        msg["event_id"] = event_id
    return parse_event(msg)


def state(*held):
    return {"mode": "state", "transitions": [{"actions": list(k), "client_ts_ms": i}
                                             for i, k in enumerate(held)]}


def test_no_control_means_no_camera():
    controls, _ = make()
    chunk = controls.next_chunk(4)
    assert chunk.camera is None and chunk.event_id is None and chunk.prompt is None


def test_script_consumed_across_chunks_then_padded():
    controls, applier = make()
    applier.apply(event("camera_actions", [["w"], ["a"], ["s"], ["d"], ["i"]], event_id=1))
    first = controls.next_chunk(3)
    assert first.camera == [["w"], ["a"], ["s"]] and first.event_id == 1
    second = controls.next_chunk(3)
    assert second.camera == [["d"], ["i"], []] and second.event_id == 1
    third = controls.next_chunk(3)
    assert third.camera == [[], [], []] and third.event_id is None


def test_new_script_replaces_unconsumed_rest():
    controls, applier = make()
    applier.apply(event("camera_actions", [["w"]] * 10))
    controls.next_chunk(2)
    applier.apply(event("camera_actions", [["d"]], event_id=4))
    assert controls.next_chunk(2).camera == [["d"], []]


def test_state_mode_pulse_hold_and_repeat():
    controls, applier = make(min_pulse=1)
    applier.apply(event("camera_actions", state(["w"], []), event_id=2))
    chunk = controls.next_chunk(4)
    assert chunk.camera == [["w"], [], [], []]  # a short press gives min_pulse_items frames
    assert chunk.event_id == 2
    applier.apply(event("camera_actions", state(["d"]), event_id=3))
    assert controls.next_chunk(4).camera == [["d"]] * 4
    assert controls.next_chunk(4).camera == [["d"]] * 4  # held state repeats


def test_state_pulse_uses_min_pulse_items_and_can_fill_the_chunk():
    controls, applier = make(min_pulse=8)
    applier.apply(event("camera_actions", state(["w"], ["a"], []), event_id=5))
    chunk = controls.next_chunk(12)
    assert chunk.camera == [["a"]] * 8 + [[]] * 4  # most recent non-empty state
    applier.apply(event("camera_actions", state(["s"], []), event_id=6))
    assert controls.next_chunk(4).camera == [["s"]] * 4


def test_script_and_state_replace_each_other():
    controls, applier = make()
    applier.apply(event("camera_actions", state(["w"])))
    applier.apply(event("camera_actions", [["d"]]))
    assert controls.next_chunk(2).camera == [["d"], []]
    applier.apply(event("camera_actions", state(["a"])))
    assert controls.next_chunk(2).camera == [["a"], ["a"]]
    assert controls.camera.num_script_frames == 0


def test_transition_queue_drops_oldest():
    controls, applier = make()
    for _ in range(3):
        applier.apply(event("camera_actions", state(*([["w"]] * 300))))
    assert len(controls.camera._transitions) == MAX_PENDING_TRANSITIONS


def test_only_latest_prompt_is_kept_and_refresh_defaults():
    controls, applier = make(refresh_default=True)
    applier.apply(event("prompt", "first", event_id=1))
    applier.apply(event("prompt", {"prompt": "second", "refresh_kv": False}, event_id=2))
    chunk = controls.next_chunk(2)
    assert (chunk.prompt, chunk.refresh_kv, chunk.event_id) == ("second", False, 2)
    assert controls.next_chunk(2).prompt is None
    applier.apply(event("prompt", "third"))
    assert controls.next_chunk(2).refresh_kv is True


def test_chunk_reports_most_recent_event():
    controls, applier = make()
    applier.apply(event("prompt", "p", event_id=7))
    applier.apply(event("camera_actions", [["w"]], event_id=8))
    assert controls.next_chunk(2).event_id == 8


def test_composite_is_atomic():
    controls, applier = make()
    bad = {"input_types": ["camera_actions", "prompt"], "camera_actions": [["w"]], "prompt": ""}
    with pytest.raises(InvalidEvent):
        applier.apply(event("composite_input", bad))
    assert controls.next_chunk(1).camera is None
    good = {"input_types": ["camera_actions", "prompt"], "camera_actions": [["w"]],
            "prompt": {"prompt": "p", "refresh_kv": True}}
    applier.apply(event("composite_input", good, event_id=9))
    chunk = controls.next_chunk(1)
    assert chunk.camera == [["w"]] and chunk.prompt == "p" and chunk.refresh_kv
    assert chunk.event_id == 9


@pytest.mark.parametrize("kind,payload", [
    ("teleport", None), ("camera_actions", [["x"]]), ("camera_actions", [["w"]] * 513),
    ("camera_actions", {"mode": "state", "transitions": [{"actions": ["q"]}]}),
    ("prompt", ""), ("prompt", {"prompt": "p", "extra": 1}), ("action", "w-0"),
    ("action", "fly-3"), ("action", 5), ("composite_input", {"input_types": ["prompt"]}),
])
def test_invalid_events(kind, payload):
    _, applier = make()
    with pytest.raises(InvalidEvent):
        applier.apply(event(kind, payload))


def test_camera_events_refused_without_camera_conditioning():
    controls, applier = make(camera=False)
    for kind, payload in (("camera_actions", [["w"]]), ("action", "w-3")):
        with pytest.raises(InvalidEvent, match="camera"):
            applier.apply(event(kind, payload))
    applier.apply(event("prompt", "fine"))
    applier.apply(event("heartbeat"))
    assert controls.next_chunk(1).prompt == "fine"


def test_parse_event_envelope():
    with pytest.raises(InvalidEvent):
        parse_event({"type": "init", "prompt": "x"})
    with pytest.raises(InvalidEvent):
        parse_event([1, 2])
    assert parse_event({"type": "event", "kind": "heartbeat", "unknown": 1}).kind == "heartbeat"


def test_action_dsl():
    assert parse_action_dsl("w-2,dw-1, none-2", None) == [["w"], ["w"], ["w", "d"], [], []]
    action_controls, applier = make()
    applier.apply(event("action", "l-2,none-1", event_id=3))
    assert action_controls.next_chunk(4).camera == [["l"], ["l"], [], []]
    with pytest.raises(ValueError):
        parse_action_dsl("w-600", 512)
