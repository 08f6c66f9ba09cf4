"""Action request envelope (spec native-media.md §5.2.1) and the msgpack numpy convention (§5.5).

The envelope's observation forms are open-ended (nested lists, ndarray maps, base64 images),
so the envelope is parsed by `parse_envelope` rather than a closed pydantic model; numeric
parameters are validated with bounds in `ActionParameters`.
"""

from __future__ import annotations

import base64
import binascii
import io
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from PIL import Image
from pydantic import BaseModel, ConfigDict, Field

from worldserve.api.schemas.lora import parse_lora
from worldserve.errors import InvalidRequest
from worldserve.ipc.messages import LoraRef

REFUSED_DTYPE_KINDS = "OVMm"
MAX_ACTION_HORIZON = 1024  # an action run's clip has horizon + 1 frames (videos: 1025 at most)
MAX_SEED = 2**63 - 1 - 16  # seeds are signed 64-bit; `seed + i` for each of 16 candidates


class ActionParameters(BaseModel):
    # extra="allow": world-model parameters reach models that declare them (spec §0.3).
    model_config = ConfigDict(extra="allow")
    num_inference_steps: int | None = Field(default=None, gt=0, le=1000)
    action_horizon: int | None = Field(default=None, gt=0, le=MAX_ACTION_HORIZON)
    action_dim: int | None = Field(default=None, gt=0)
    seed: int | None = Field(default=None, ge=-MAX_SEED, le=MAX_SEED)
    candidate_count: int | None = Field(default=None, ge=1, le=16)
    candidate_reducer: Literal["mean"] | None = None
    return_candidates: bool | None = False
    action_mode: str | None = None


class ActionRuntime(BaseModel):
    model_config = ConfigDict(extra="allow")
    return_timing: bool = True
    output_format: Literal["list", "numpy"] | None = None
    response_format: Literal["envelope", "raw"] = "envelope"


@dataclass
class ActionEnvelope:
    request_id: str | None
    task: str
    images: list[bytes] = field(default_factory=list)
    state: np.ndarray | None = None
    noise: np.ndarray | None = None
    references: list[str] = field(default_factory=list)
    parameters: ActionParameters = field(default_factory=ActionParameters)
    runtime: ActionRuntime = field(default_factory=ActionRuntime)
    lora: list[LoraRef] = field(default_factory=list)


# ---------------------------------------------------------------------- numpy convention


def decode_numpy(obj: Any) -> Any:
    """msgpack object hook: `{"__ndarray__": true, ...}` -> ndarray (refusing unsafe dtypes)."""
    if not isinstance(obj, dict):
        return obj
    if obj.get("__ndarray__") is True or obj.get("__npgeneric__") is True:
        try:
            dtype = np.dtype(obj["dtype"])
        except (KeyError, TypeError) as exc:
            raise InvalidRequest(f"ndarray without a valid dtype: {exc}") from None
        if dtype.kind in REFUSED_DTYPE_KINDS:
            raise InvalidRequest(f"ndarray dtype {dtype.str!r} is not accepted")
        try:
            arr = np.frombuffer(obj["data"], dtype=dtype)
            if obj.get("__ndarray__"):
                return arr.reshape(obj["shape"])
            return arr[0]
        except (KeyError, ValueError, TypeError, IndexError) as exc:
            raise InvalidRequest(f"malformed ndarray: {exc}") from None
    return obj


def encode_numpy(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": True, "data": np.ascontiguousarray(obj).tobytes(),
                "dtype": obj.dtype.str, "shape": list(obj.shape)}
    if isinstance(obj, np.generic):
        return {"__npgeneric__": True, "data": obj.tobytes(), "dtype": obj.dtype.str}
    return obj


# ---------------------------------------------------------------------- envelope


def _array(value: Any, name: str) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, dict) and ("values" in value or "data" in value):
        data = value.get("values", value.get("data"))
        dtype = value.get("dtype", "float32")
        if isinstance(data, (bytes, bytearray)):
            return decode_numpy({"__ndarray__": True, "data": bytes(data), "dtype": dtype,
                                 "shape": value.get("shape", [-1])})
        arr = _list_array(data, name, dtype)
        return arr.reshape(value["shape"]) if "shape" in value else arr
    return _list_array(value, name, None)


def _list_array(value: Any, name: str, dtype: Any) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=dtype)
    except (ValueError, TypeError) as exc:
        raise InvalidRequest(f"{name} is not a numeric array: {exc}", param=name) from None
    if arr.dtype.kind not in "biuf":
        raise InvalidRequest(f"{name} must be numeric", param=name)
    return arr


def _image_bytes(value: Any, name: str) -> bytes:
    """An observation image in any accepted form -> PNG (or the original encoded) bytes."""
    if isinstance(value, dict) and ("b64_json" in value or "base64" in value):
        try:
            return base64.b64decode(value.get("b64_json") or value.get("base64"), validate=True)
        except (binascii.Error, ValueError, TypeError):
            raise InvalidRequest(f"{name}: invalid base64", param=name) from None
    arr = _array(value, name)
    if arr.ndim == 3 and arr.shape[0] in (1, 3) and arr.shape[-1] not in (1, 3):
        arr = arr.transpose(1, 2, 0)  # CHW -> HWC
    if arr.ndim == 2:
        arr = arr[..., None]
    if arr.ndim != 3 or arr.shape[-1] not in (1, 3) or min(arr.shape[:2]) < 1:
        raise InvalidRequest(f"{name} must be an image array of shape [H, W, 3] (got "
                             f"{list(arr.shape)})", param=name)
    if arr.dtype.kind == "f":
        arr = np.clip(arr * 255.0 if arr.max() <= 1.0 else arr, 0, 255)
    arr = arr.astype(np.uint8)
    if arr.shape[-1] == 1:
        arr = np.repeat(arr, 3, axis=-1)
    buf = io.BytesIO()
    Image.fromarray(arr, "RGB").save(buf, "PNG")
    return buf.getvalue()


def _from_flat(payload: dict[str, Any]) -> dict[str, Any]:
    """OpenPI flat form (`observation.images.<cam>`, `observation.state`, `prompt`) -> envelope."""
    images = {k.split(".", 2)[2]: v for k, v in payload.items()
              if k.startswith("observation.images.")}
    obs: dict[str, Any] = {"images": images}
    for key in ("state", "noise"):
        if f"observation.{key}" in payload:
            obs[key] = payload[f"observation.{key}"]
    rest = {k: v for k, v in payload.items() if not k.startswith("observation.")}
    rest.setdefault("input", {})
    rest["input"] = {**rest["input"], "observation": obs}
    if "prompt" in payload:
        rest["input"].setdefault("prompt", payload["prompt"])
    return rest


def parse_envelope(payload: dict[str, Any]) -> ActionEnvelope:
    if any(k.startswith("observation.") for k in payload):
        payload = _from_flat(payload)
    inp = payload.get("input") or {}
    if not isinstance(inp, dict):
        raise InvalidRequest("input must be an object", param="input")
    obs = inp.get("observation") or {}
    if not isinstance(obs, dict):
        raise InvalidRequest("input.observation must be an object", param="input.observation")
    cams = obs.get("images") or {}
    if not isinstance(cams, dict):
        raise InvalidRequest("input.observation.images must map camera names to images",
                             param="input.observation.images")
    images = [_image_bytes(v, f"input.observation.images.{k}") for k, v in cams.items()]
    refs: list[str] = []
    for key in ("image", "images", "image_path", "input_reference"):
        value = inp.get(key)
        values = value if isinstance(value, list) else ([value] if value is not None else [])
        for item in values:
            if isinstance(item, str):
                refs.append(item)
            else:
                images.append(_image_bytes(item, f"input.{key}"))
    for key in ("video", "video_path"):
        if inp.get(key):
            raise InvalidRequest("inverse_dynamics (video input) is not supported by this "
                                 "action head", param=f"input.{key}")
    task = inp.get("task") or inp.get("prompt") or ""
    if not isinstance(task, str):
        raise InvalidRequest("input.task must be a string", param="input.task")
    state = _array(obs["state"], "input.observation.state").astype("<f4").ravel() \
        if obs.get("state") is not None else None
    noise = _array(obs["noise"], "input.observation.noise").astype("<f4") \
        if obs.get("noise") is not None else None
    try:
        parameters = ActionParameters.model_validate(payload.get("parameters") or {})
        runtime = ActionRuntime.model_validate(payload.get("runtime") or {})
    except Exception as exc:
        from pydantic import ValidationError

        if isinstance(exc, ValidationError):
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise InvalidRequest(f"{loc}: {first['msg']}", param=loc) from None
        raise
    rid = payload.get("request_id") or payload.get("id")
    lora = parse_lora(payload.get("lora", getattr(parameters, "lora", None)))
    return ActionEnvelope(request_id=str(rid) if rid is not None else None, task=task,
                          images=images, state=state, noise=noise, references=refs,
                          parameters=parameters, runtime=runtime, lora=lora)
