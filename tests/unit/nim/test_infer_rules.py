"""The Generator NIM's request rules (`/v1/infer`): the cookbook's request shapes resolve, and
each documented rule refuses what breaks it, naming the field."""

from __future__ import annotations

import msgspec
import pytest

from worldserve.api.nim.infer_rules import RESOLUTIONS, resolve
from worldserve.api.nim.infer_schema import parse_infer
from worldserve.errors import InvalidRequest
from worldserve.ipc.capabilities import GenerationCapabilities, GenerationDefaults

IMAGE = "data:image/jpeg;base64,AAAA"
VIDEO = "data:video/mp4;base64,AAAA"
REAL = GenerationCapabilities(family="cosmos3", variant="nano")
DEV = msgspec.structs.replace(REAL, defaults=GenerationDefaults(resolution_divisor=16))
T2V = {"model_mode": "text2video", "prompt": "{\"scene\":\"kitchen\"}", "negative_prompt": "",
       "resolution": "720_16_9", "num_frames": 189, "fps": 24.0, "num_inference_steps": 35,
       "guidance_scale": 6.0, "flow_shift": 10.0, "seed": 0}
T2I = {**T2V, "model_mode": "text2image", "resolution": "720_1_1", "num_frames": 1,
       "num_inference_steps": 50, "guidance_scale": 4.0, "flow_shift": 3.0}
I2V = {**T2V, "model_mode": "image2video", "resolution": "720", "input_reference": IMAGE}
V2V = {**T2V, "model_mode": "video2video", "resolution": "720", "num_frames": 93,
       "input_reference": VIDEO, "condition_frame_indexes_vision": [1, 0, 1],
       "condition_video_keep": "first"}
AV = {"domain_name": "av", "action_chunk_size": 60, "raw_action_dim": 9,
      "action_space": "joint_pos", "image_size": "480", "action_fps": 10.0}
FORWARD = {"model_mode": "forward_dynamics", "prompt": "drive", "input_reference": IMAGE,
           "action_params": {**AV, "action": [[0.0] * 9] * 60}, "fps": 10.0,
           "num_inference_steps": 30, "guidance_scale": 1.0, "flow_shift": 10.0, "seed": 0}
POLICY = {**FORWARD, "model_mode": "policy", "action_params": AV}
INVERSE = {**POLICY, "model_mode": "inverse_dynamics", "input_reference": VIDEO}


def job(body: dict, caps: GenerationCapabilities = REAL):
    return resolve(parse_infer(body), caps)


@pytest.mark.parametrize("body, size, frames", [
    (T2V, (1280, 720), 189), (T2I, (960, 960), 1), (I2V, (1280, 720), 189),
    (V2V, (1280, 720), 93), (FORWARD, (0, 0), 61), (POLICY, (0, 0), 61),
    (INVERSE, (0, 0), 61),
])
def test_the_cookbook_shapes_resolve(body: dict, size: tuple[int, int], frames: int) -> None:
    resolved = job(body)
    assert (resolved.width, resolved.height) == size and resolved.num_frames == frames
    assert resolved.resolution_note is None


def test_defaults_and_details() -> None:
    bare = job({"model_mode": "text2image", "prompt": "a cup"})
    assert (bare.width, bare.height, bare.steps, bare.guidance, bare.flow_shift) == \
        (960, 960, 50, 4.0, 3.0)
    assert job(V2V).condition_frame_indexes_vision == [0, 1]  # sorted, deduplicated
    forward = job(FORWARD)
    assert forward.action["rows"] == [[0.0] * 9] * 60 and forward.action["tier"] == 480
    assert job(POLICY).action["rows"] is None and job(POLICY).steps == 30
    assert set(RESOLUTIONS) == {f"{t}_{a}" for t in (256, 480, 720)
                                for a in ("16_9", "1_1", "9_16", "4_3", "3_4")}


def test_a_dev_checkpoint_serves_keys_at_a_fraction_and_says_so() -> None:
    resolved = job(T2V, DEV)
    assert (resolved.width, resolved.height) == (80, 48)
    assert "1280x720" in resolved.resolution_note and "80x48" in resolved.resolution_note


@pytest.mark.parametrize("change, field, words", [
    ({"num_inference_steps": "35"}, "num_inference_steps", "valid integer"),
    ({"num_inference_steps": 35.0}, "num_inference_steps", "valid integer"),
    ({"num_inference_steps": True}, "num_inference_steps", "valid integer"),
    ({"num_inference_steps": 101}, "num_inference_steps", "less than or equal to 100"),
    ({"guidance_scale": 7.5}, "guidance_scale", "less than or equal to 7"),
    ({"fps": 0.5}, "fps", "greater than or equal to 1"),
    ({"seed": -1}, "seed", "greater than or equal to 0"),
    ({"bogus": 1}, "bogus", "unknown field"),
    ({"steps": 35}, "steps", "retired"),
    ({"num_output_frames": 9}, "num_output_frames", "retired"),
    ({"image": IMAGE}, "image", "retired"),
    ({"extra_params": "{}"}, "extra_params", "vLLM-Omni"),
    ({"guardrails": True}, "guardrails", "vLLM-Omni"),
    ({"show_progress": True}, "show_progress", "vLLM-Omni"),
    ({"model_mode": "image2image"}, "model_mode", "Input should be"),
    ({"prompt": " "}, "prompt", "non-empty prompt"),
    ({"prompt": "x" * 20_001}, "prompt", "at most 20000"),
    ({"input_reference": IMAGE}, "input_reference", "not allowed for text2video"),
    ({"resolution": "1080"}, "resolution", "not a key"),
    ({"num_frames": 21}, "num_frames", "at least 25"),
    ({"num_frames": 190}, "num_frames", "1 + 4k"),
    ({"num_frames": 201}, "num_frames", "at most 197"),
    ({"condition_video_keep": "first"}, "condition_frame_indexes_vision", "video2video fields"),
    ({"action_params": AV}, "action_params", "action modes"),
    ({"transfer": {"edge": {"video": VIDEO}}}, "transfer", "no control inputs"),
])
def test_video_rules(change: dict, field: str, words: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        job({**T2V, **change})
    assert caught.value.param == field and words in caught.value.message


@pytest.mark.parametrize("body, field, words", [
    ({**T2I, "num_frames": 5}, "num_frames", "num_frames 1"),
    ({**I2V, "input_reference": "  "}, "input_reference", "requires an image"),
    ({**V2V, "condition_frame_indexes_vision": [0, 23, 24]},
     "condition_frame_indexes_vision", "from 0 to 23"),
    ({**FORWARD, "resolution": "480"}, "resolution", "not allowed for forward_dynamics"),
    ({**FORWARD, "num_frames": 61}, "num_frames", "derives it"),
    ({**FORWARD, "action_params": {**FORWARD["action_params"], "action_chunk_size": 62}},
     "action_params.action_chunk_size", "multiple of 4"),
    ({**FORWARD, "action_params": {**FORWARD["action_params"], "action": [[0.0] * 9] * 59}},
     "action_params.action", "[60][9]"),
    ({**FORWARD, "action_params": {**AV, "action": [[0.0] * 10] * 60}},
     "action_params.action", "[60][9]"),
    ({**FORWARD, "action_params": {**AV, "action": [["0"] * 9] * 60}},
     "action_params.action.0.0", "valid number"),
    ({**FORWARD, "action_params": AV}, "action_params.action", "requires action_params.action"),
    ({**POLICY, "action_params": {**AV, "action": [[0.0] * 9] * 60}},
     "action_params.action", "predicts it"),
    ({**POLICY, "action_params": {**AV, "raw_action_dim": 10}},
     "action_params.raw_action_dim", "must be 9"),
    ({**POLICY, "action_params": {**AV, "domain_name": "pusht"}},
     "action_params.domain_name", "Input should be"),
    ({**POLICY, "action_params": {**AV, "image_size": 480}},
     "action_params.image_size", "Input should be"),
    ({**POLICY, "action_params": {**AV, "mode": "policy"}}, "action_params.mode", "retired"),
    ({**POLICY, "action_params": {**AV, "view_point": "ego_view"}},
     "action_params.view_point", "unknown field"),
    ({**INVERSE, "action_params": {**AV, "use_state": True}},
     "action_params.use_state", "policy-only"),
    ({**POLICY, "action_params": {**AV, "observation": {"x": 1}}},
     "action_params.observation", "no state input"),
    ({**POLICY, "action_params": None}, "action_params", "requires action_params"),
])
def test_mode_rules(body: dict, field: str, words: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        job(body)
    assert caught.value.param == field and words in caught.value.message


def test_specialists_serve_their_mode_and_own_their_sampling() -> None:
    t2i_4step = msgspec.structs.replace(REAL, variant="super-t2i-4step",
                                        model_modes=("text2image",))
    with pytest.raises(InvalidRequest, match="serves text2image only"):
        job(T2V, t2i_4step)
    with pytest.raises(InvalidRequest, match="owns num_inference_steps"):
        job(T2I, t2i_4step)
    owned = {k: v for k, v in T2I.items()
             if k not in ("num_inference_steps", "guidance_scale", "flow_shift")}
    resolved = job(owned, t2i_4step)
    assert (resolved.steps, resolved.guidance, resolved.flow_shift) == (None, None, None)


def test_the_body_must_be_an_object() -> None:
    with pytest.raises(InvalidRequest, match="JSON object"):
        parse_infer([T2V])
