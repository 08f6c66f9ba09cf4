"""vLLM-Omni realtime messages -> the realtime service's own types (one mapping, both ways).

`session.start` becomes the service's `InitRequest` (so sizes, model limits and the first-frame
media policy are checked by the same code as the SGLang protocol); `session.interaction`
becomes the `ControlUpdate`s that `SessionControls` samples at the next chunk boundary. The
engine never learns which protocol spoke. Field names in errors are vLLM-Omni's.
"""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import ValidationError

from worldserve.api.realtime.controls import (
    ControlUpdate,
    PromptUpdate,
    ScriptUpdate,
    StateUpdate,
)
from worldserve.api.realtime.omni_messages import InvalidMessage, SessionStart
from worldserve.api.schemas.realtime import CAMERA_KEYS, InitRequest
from worldserve.ipc.capabilities import RealtimeCapabilities

# The SGLang-side field a service error names -> the vLLM-Omni field the client sent.
PARAM_NAMES = {
    "first_frame": "image_reference.image_url",
    "condition_inputs": "extra_params",
    "condition_inputs.action": "extra_params.sana_wm.action",
    "condition_inputs.intrinsics": "extra_params.sana_wm.intrinsics",
}
EXTRA_PARAMS = ("camera_action_script", "sana_wm")
SANA_WM_PARAMS = ("action", "intrinsics")
LINGBOT_CAMERA_SCHEMA = "lingbot.camera_actions.v1"  # vLLM-Omni's LingBot key-script schema
EPSILON = 1e-9


def omni_param(param: str | None) -> str | None:
    return PARAM_NAMES.get(param, param) if param else param


def omni_message(message: str, param: str | None) -> str:
    """A service error's text with the SGLang field names in vLLM-Omni's spelling."""
    if param not in PARAM_NAMES:
        return message
    for sglang in sorted(PARAM_NAMES, key=len, reverse=True):  # the longest name first
        message = re.sub(rf"(?<![\w.]){re.escape(sglang)}(?![\w.])", PARAM_NAMES[sglang],
                         message)
    return message


# ------------------------------------------------------------------ session.start


def resolve_size(start: SessionStart) -> tuple[int, int] | None:
    """vLLM-Omni's precedence: `size` over top-level width/height over `video_params`."""
    if start.size:
        width, height = (int(v) for v in start.size.split("x"))
        return width, height
    params = start.video_params
    width = start.width or (params.width if params else None)
    height = start.height or (params.height if params else None)
    if (width is None) != (height is None):
        field = "height" if width is not None else "width"
        raise InvalidMessage(f"Invalid session.start: {field} is required with "
                             f"{'width' if field == 'height' else 'height'}", field)
    return (width, height) if width and height else None


def resolve_num_frames(start: SessionStart, fps: int) -> int | None:
    params = start.video_params
    num_frames = start.num_frames or (params.num_frames if params else None)
    if num_frames is None and start.seconds is not None:
        num_frames = int(start.seconds) * fps
    return num_frames


def chunks_for(num_frames: int, facts: RealtimeCapabilities) -> int:
    """The fewest whole chunks that hold `num_frames` frames."""
    total, count = 0, 0
    while total < num_frames:
        total += facts.frames_in_chunk(count)
        count += 1
    return count


def latent_spans(num_frames: int, num_latents: int, upsampling: int) -> list[int]:
    """Output frames per latent frame of one chunk: causal first chunks decode 1 + t + t ...;
    otherwise the frames are split evenly (the first latents take any remainder)."""
    if num_latents > 1 and num_frames == 1 + (num_latents - 1) * upsampling:
        return [1] + [upsampling] * (num_latents - 1)
    base, extra = divmod(num_frames, num_latents)
    return [base + (1 if i < extra else 0) for i in range(num_latents)]


def _keys(value: Any, field: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(k, str) for k in value):
        raise InvalidMessage(f"{field} must be a list of keys", field)
    keys = sorted({k.lower() for k in value}, key="wasdijkl".index) if all(
        k.lower() in CAMERA_KEYS for k in value) else None
    if keys is None:
        raise InvalidMessage(f"{field}: supports only W/A/S/D/I/J/K/L action keys", field)
    return keys


def expand_action_script(script: Any, facts: RealtimeCapabilities,
                         first_chunk: int = 0, field: str = "extra_params.camera_action_script"
                         ) -> list[list[str]]:
    """LingBot's `camera_action_script` (per chunk, one key list per latent frame) -> one key
    list per output frame, chunk by chunk from `first_chunk`."""
    latents = facts.latent_frames_per_block
    if not isinstance(script, list) or not script:
        raise InvalidMessage(f"{field} must be a non-empty list of per-chunk action lists", field)
    frames: list[list[str]] = []
    for index, chunk in enumerate(script):
        where = f"{field}[{index}]"
        if not isinstance(chunk, list) or len(chunk) != latents:
            raise InvalidMessage(f"{where} must contain exactly {latents} per-latent-frame "
                                 "action lists", where)
        spans = latent_spans(facts.frames_in_chunk(first_chunk + index), latents,
                             facts.temporal_upsampling)
        for j, (keys, span) in enumerate(zip(chunk, spans)):
            frames.extend(_keys(keys, f"{where}[{j}]") for _ in range(span))
    return frames


def _condition_inputs(extra: dict[str, Any], facts: RealtimeCapabilities) -> dict[str, Any]:
    for key in extra:
        if key not in EXTRA_PARAMS:
            raise InvalidMessage(f"Invalid session.start: extra_params.{key} is not supported "
                                 f"here (supported: {', '.join(EXTRA_PARAMS)})",
                                 f"extra_params.{key}")
    sana = extra.get("sana_wm") or {}
    if not isinstance(sana, dict):
        raise InvalidMessage("extra_params.sana_wm must be a JSON object", "extra_params.sana_wm")
    for key in sana:
        if key not in SANA_WM_PARAMS:
            raise InvalidMessage(f"extra_params.sana_wm.{key} is not supported here "
                                 f"(supported: {', '.join(SANA_WM_PARAMS)})",
                                 f"extra_params.sana_wm.{key}")
    if "camera_action_script" in extra and "action" in sana:
        raise InvalidMessage("give one camera script: extra_params.camera_action_script or "
                             "extra_params.sana_wm.action", "extra_params")
    inputs: dict[str, Any] = {}
    if "camera_action_script" in extra:
        inputs["camera_actions"] = expand_action_script(extra["camera_action_script"], facts)
    if "action" in sana:
        inputs["action"] = sana["action"]
    if "intrinsics" in sana:
        k = sana["intrinsics"]
        if not isinstance(k, dict) or set(k) != {"fx", "fy", "cx", "cy"}:
            raise InvalidMessage("extra_params.sana_wm.intrinsics must be "
                                 "{fx, fy, cx, cy}", "extra_params.sana_wm.intrinsics")
        inputs["intrinsics"] = [k["fx"], k["fy"], k["cx"], k["cy"]]
    return inputs


def _first_frame(start: SessionStart) -> str | None:
    ref = start.image_reference
    if ref is None:
        return None
    if isinstance(ref, list):
        if len(ref) != 1:
            raise InvalidMessage("image_reference: this model takes one first frame; send "
                                 "one reference", "image_reference")
        ref = ref[0]
    if not isinstance(ref, dict) or set(ref) - {"image_url", "file_id"} or len(ref) != 1:
        raise InvalidMessage("image_reference must be {\"image_url\": ...} or "
                             "{\"file_id\": ...}", "image_reference")
    if "file_id" in ref:
        raise InvalidMessage("Invalid image_reference: file_id is not supported yet.",
                             "image_reference.file_id")
    if not isinstance(ref["image_url"], str) or not ref["image_url"]:
        raise InvalidMessage("image_reference.image_url must be a URL or data URL",
                             "image_reference.image_url")
    return ref["image_url"]


def start_to_init(start: SessionStart, facts: RealtimeCapabilities) -> InitRequest:
    """The service's init for this `session.start` (engine-dependent checks come later)."""
    size = resolve_size(start)
    fps = start.fps or (start.video_params.fps if start.video_params else None)
    num_frames = resolve_num_frames(start, fps or facts.default_fps)
    init: dict[str, Any] = {
        "type": "init", "prompt": start.prompt, "negative_prompt": start.negative_prompt,
        "num_inference_steps": start.num_inference_steps, "fps": fps,
        "size": f"{size[0]}x{size[1]}" if size else None, "first_frame": _first_frame(start),
        "max_chunks": chunks_for(num_frames, facts) if num_frames else None,
    }
    if start.seed is not None:
        init["seed"] = start.seed
    if start.guidance_scale is not None:
        init["guidance_scale"] = start.guidance_scale
    inputs = _condition_inputs(start.extra_params or {}, facts)
    if inputs:
        init["condition_inputs"] = inputs
    try:
        return InitRequest.model_validate(init)
    except ValidationError as exc:
        raise _init_error(exc) from None


def _init_error(exc: ValidationError) -> InvalidMessage:
    """An init validation error in vLLM-Omni's field names."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ()))
    text = err["msg"].removeprefix("Value error, ")
    head = text.split(":")[0]
    if loc == "condition_inputs" and head in ("action", "intrinsics"):
        loc, text = f"condition_inputs.{head}", text[len(head) + 1:].strip()
    param = omni_param(loc) or loc
    return InvalidMessage(f"Invalid session.start: {param}: {text}", param)


# ------------------------------------------------------------------ session.interaction


def _vector(value: Any, length: int, field: str) -> list[float]:
    ok = isinstance(value, list) and len(value) == length and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        for v in value)
    if not ok:
        raise InvalidMessage(f"{field} must be {length} finite numbers", field)
    return [float(v) for v in value]


def se3_velocity_keys(data: Any, field: str) -> list[str]:
    """A per-frame SE3 delta (Unity frame: +X right, +Y up, +Z forward; rotation a unit
    quaternion [x, y, z, w]) -> the held keys that move the same way (magnitudes are the
    model's fixed key steps; only the signs are used)."""
    if not isinstance(data, dict) or set(data) - {"translation", "rotation"}:
        raise InvalidMessage(f"{field} must be {{translation, rotation}}", field)
    tx, ty, tz = _vector(data.get("translation", [0, 0, 0]), 3, f"{field}.translation")
    qx, qy, qz, _ = _vector(data.get("rotation", [0, 0, 0, 1]), 4, f"{field}.rotation")
    if abs(ty) > EPSILON or abs(qz) > EPSILON:
        raise InvalidMessage(f"{field}: vertical motion (translation[1]) and roll "
                             "(rotation[2]) have no camera key on this model; send 0", field)
    keys = []
    for value, positive, negative in ((tz, "w", "s"), (tx, "d", "a"), (qx, "i", "k"),
                                      (qy, "l", "j")):
        if abs(value) > EPSILON:
            keys.append(positive if value > 0 else negative)
    return sorted(keys, key="wasdijkl".index)


def camera_update(camera: Any, facts: RealtimeCapabilities,
                  field: str = "interaction.event.multi_modal_data.camera") -> ControlUpdate:
    """`event.multi_modal_data.camera` -> a script or held-key update."""
    if not facts.camera_conditioning:
        raise InvalidMessage(f"{field}: this model has no camera conditioning", field,
                             "interaction_failed")
    if not isinstance(camera, dict):
        raise InvalidMessage(f"{field} must be a JSON object", field)
    schema, mode = camera.get("schema"), camera.get("mode", "target")
    if schema == LINGBOT_CAMERA_SCHEMA:
        return _lingbot_update(camera, facts, field)
    if schema is not None:
        raise InvalidMessage(f"{field}.schema: {schema!r} is not supported (omit it for SE3, or "
                             f"use {LINGBOT_CAMERA_SCHEMA!r})", f"{field}.schema",
                             "unsupported_interaction_schema")
    if set(camera) - {"mode", "data"}:
        raise InvalidMessage(f"{field}: expected only mode and data", field)
    if mode != "velocity":
        raise InvalidMessage(f"{field}.mode: {mode!r} is not supported; this model moves by "
                             "held keys, send mode 'velocity'", f"{field}.mode",
                             "interaction_failed")
    return StateUpdate([se3_velocity_keys(camera.get("data"), f"{field}.data")])


def _lingbot_update(camera: dict[str, Any], facts: RealtimeCapabilities,
                    field: str) -> ControlUpdate:
    data = camera.get("data")
    if not isinstance(data, dict):
        raise InvalidMessage(f"{field}.data must be a JSON object", f"{field}.data")
    if data.get("mode") == "script":
        frames = expand_action_script([data.get("frames")], facts, first_chunk=1,
                                      field=f"{field}.data.frames")
        return ScriptUpdate(frames)
    if data.get("mode") == "state":
        transitions = data.get("transitions")
        if not isinstance(transitions, list) or not transitions or not all(
                isinstance(t, dict) for t in transitions):
            raise InvalidMessage(f"{field}.data.transitions must be a non-empty list of "
                                 "{actions}", f"{field}.data.transitions")
        return StateUpdate([_keys(t.get("actions"), f"{field}.data.transitions[{i}].actions")
                            for i, t in enumerate(transitions)])
    raise InvalidMessage(f"{field}.data.mode must be 'script' or 'state'", f"{field}.data.mode")


def interaction_updates(event: Any, facts: RealtimeCapabilities,
                        refresh_kv: bool) -> list[ControlUpdate]:
    """`interaction.event` -> validated updates (nothing is applied when one part fails)."""
    field = "interaction.event"
    if not isinstance(event, dict):
        raise InvalidMessage("session.interaction requires event object", field)
    unknown = set(event) - {"prompt", "negative_prompt", "multi_modal_data"}
    if unknown:
        raise InvalidMessage(f"{field}.{sorted(unknown)[0]} is not supported",
                             f"{field}.{sorted(unknown)[0]}")
    if event.get("negative_prompt") is not None:
        raise InvalidMessage("session.interaction negative_prompt is not supported in this "
                             "release", f"{field}.negative_prompt")
    updates: list[ControlUpdate] = []
    media = event.get("multi_modal_data")
    if media is not None:
        if not isinstance(media, dict) or set(media) - {"camera"}:
            raise InvalidMessage(f"{field}.multi_modal_data supports only camera",
                                 f"{field}.multi_modal_data")
        updates.append(camera_update(media.get("camera"), facts))
    prompt = event.get("prompt")
    if prompt is not None or not updates:
        if not isinstance(prompt, str) or not prompt.strip():
            raise InvalidMessage("session.interaction requires a non-empty event.prompt",
                                 f"{field}.prompt")
        updates.append(PromptUpdate(prompt, refresh_kv))
    return updates


def transition_chunks(value: Any) -> None:
    """Only a hard switch (0, the default) is possible: controls apply at the next chunk."""
    field = "interaction.transition_chunks"
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not value.is_integer()):
        raise InvalidMessage("session.interaction transition_chunks must be an integer", field)
    if value < 0:
        raise InvalidMessage("session.interaction transition_chunks must be >= 0", field)
    if value > 0:
        raise InvalidMessage("session.interaction transition_chunks: this model switches at "
                             "the next chunk boundary; send 0 or omit it", field)
