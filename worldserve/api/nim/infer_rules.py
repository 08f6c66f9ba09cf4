"""The Generator NIM's per-mode rules (cookbook generation.md, action.md, api-reference.md) over
a parsed `InferRequest`, and the request they resolve to: `NimJob`, what the route turns into
the native request. Messages name the field and the rule (the route answers them with 422).

Resolution keys come from the NIM's table; a checkpoint whose declaration has a
`resolution_divisor` (the tiny dev checkpoint: 16) serves each key at that fraction of the
table's size (rounded to 16 pixels), which the route says in `X-Worldserve-Resolution`.
"""

from __future__ import annotations

from dataclasses import dataclass

from worldserve.api.nim.infer_schema import ACTION_MODES, MAX_IMAGE_REFERENCE_CHARS, InferRequest
from worldserve.errors import InvalidRequest
from worldserve.ipc.capabilities import GenerationCapabilities

# (width, height) per key; a bare tier is its 16:9 shape (generation.md "Resolution keys").
RESOLUTIONS: dict[str, tuple[int, int]] = {
    "256_16_9": (320, 192), "256_1_1": (256, 256), "256_9_16": (192, 320),
    "256_4_3": (320, 256), "256_3_4": (256, 320),
    "480_16_9": (832, 480), "480_1_1": (640, 640), "480_9_16": (480, 832),
    "480_4_3": (736, 544), "480_3_4": (544, 736),
    "720_16_9": (1280, 720), "720_1_1": (960, 960), "720_9_16": (720, 1280),
    "720_4_3": (1104, 832), "720_3_4": (832, 1104),
}
MAX_FRAMES = {"256": 397, "480": 297, "720": 197}
MIN_VIDEO_FRAMES = 25
DOMAIN_DIMS = {"av": 9, "umi": 10, "bridge_orig_lerobot": 10, "droid_lerobot": 10}
REFERENCE_KIND = {"image2video": "image", "video2video": "video", "forward_dynamics": "image",
                  "policy": "image", "inverse_dynamics": "video"}
# Omitted fields per mode (generation.md T2I table, the cookbook's flows, action.md defaults);
# flow_shift None keeps the checkpoint scheduler's own.
DEFAULTS = {
    "text2image": dict(resolution="720_1_1", num_frames=1, steps=50, guidance=4.0,
                       flow_shift=3.0, fps=24.0),
    "video": dict(resolution="720", num_frames=189, steps=35, guidance=6.0, flow_shift=10.0,
                  fps=24.0),
    "action": dict(resolution=None, num_frames=None, steps=30, guidance=1.0, flow_shift=None,
                   fps=10.0),
}
SAMPLING_OWNED = ("num_inference_steps", "guidance_scale", "flow_shift")


@dataclass
class NimJob:
    """A `/v1/infer` request after the NIM's rules: everything explicit."""

    mode: str
    prompt: str
    negative_prompt: str | None  # None: the pipeline's default negative prompt
    reference: str | None  # the encoded image / video (raw base64, data URL or URL)
    seed: int | None
    steps: int | None  # None: the specialist checkpoint's own (4-step variants)
    guidance: float | None
    flow_shift: float | None
    width: int
    height: int
    num_frames: int
    fps: float
    resolution_note: str | None = None
    condition_frame_indexes_vision: list[int] | None = None
    condition_video_keep: str | None = None
    action: dict | None = None  # domain_name, chunk, rows, tier (forward_dynamics: rows)


def resolve(req: InferRequest, caps: GenerationCapabilities) -> NimJob:
    """`req` checked against the NIM's rules and the checkpoint's variant; 400 naming the rule."""
    mode = req.model_mode
    _check_variant(req, caps)
    if req.transfer is not None:
        raise InvalidRequest("transfer is not served: this checkpoint's pipeline (diffusers "
                             "Cosmos3OmniPipeline) has no control inputs (edge, blur, depth, "
                             "seg, wsm); send video2video without transfer", param="transfer")
    reference = _reference(req)
    if mode not in ("video2video",) and (req.condition_frame_indexes_vision is not None
                                         or req.condition_video_keep is not None):
        raise InvalidRequest("condition_frame_indexes_vision and condition_video_keep are "
                             "video2video fields", param="condition_frame_indexes_vision")
    if mode in ACTION_MODES:
        return _action_job(req, caps, reference)
    if req.action_params is not None:
        raise InvalidRequest(f"action_params is for the action modes, not {mode}",
                             param="action_params")
    return _media_job(req, caps, reference)


def _check_variant(req: InferRequest, caps: GenerationCapabilities) -> None:
    modes = caps.model_modes
    if modes is not None and req.model_mode not in modes:
        raise InvalidRequest(f"this checkpoint (model_variant {caps.variant!r}) serves "
                             f"{', '.join(modes)} only, not {req.model_mode}", param="model_mode")
    if (caps.variant or "").endswith("-4step"):
        for name in SAMPLING_OWNED:
            if getattr(req, name) is not None:
                raise InvalidRequest(f"{name}: the {caps.variant} checkpoint owns "
                                     "num_inference_steps, guidance_scale and flow_shift; omit "
                                     "them", param=name)


def _reference(req: InferRequest) -> str | None:
    """`input_reference` as each mode requires it (blank counts as absent)."""
    value = req.input_reference if (req.input_reference or "").strip() else None
    kind = REFERENCE_KIND.get(req.model_mode)
    if kind is None:
        if value is not None:
            raise InvalidRequest(f"input_reference is not allowed for {req.model_mode}",
                                 param="input_reference")
        return None
    if value is None:
        raise InvalidRequest(f"{req.model_mode} requires an {kind} in input_reference",
                             param="input_reference")
    if kind == "image" and len(value) > MAX_IMAGE_REFERENCE_CHARS:
        raise InvalidRequest(f"input_reference: an image reference is at most "
                             f"{MAX_IMAGE_REFERENCE_CHARS} characters", param="input_reference")
    return value


def _media_job(req: InferRequest, caps: GenerationCapabilities, reference: str | None) -> NimJob:
    mode = req.model_mode
    image = mode == "text2image"
    base = DEFAULTS["text2image" if image else "video"]
    prompt = req.prompt or ""
    if mode in ("text2image", "text2video") and not prompt.strip():
        raise InvalidRequest(f"{mode} requires a non-empty prompt", param="prompt")
    key = req.resolution or str(base["resolution"])
    width, height, note = _size(key, caps)
    num_frames = req.num_frames if req.num_frames is not None else int(base["num_frames"])
    _check_frames(num_frames, image, key)
    indexes = _indexes(req.condition_frame_indexes_vision, num_frames)
    return NimJob(mode=mode, prompt=prompt, negative_prompt=req.negative_prompt,
                  reference=reference, seed=req.seed, width=width, height=height,
                  num_frames=num_frames, fps=req.fps or float(base["fps"]),
                  resolution_note=note, condition_frame_indexes_vision=indexes,
                  condition_video_keep=req.condition_video_keep,
                  **_sampling(req, caps, base))


def _sampling(req: InferRequest, caps: GenerationCapabilities, base: dict) -> dict:
    owned = (caps.variant or "").endswith("-4step")
    return {"steps": req.num_inference_steps or (None if owned else base["steps"]),
            "guidance": req.guidance_scale or (None if owned else base["guidance"]),
            "flow_shift": req.flow_shift or (None if owned else base["flow_shift"])}


def _size(key: str, caps: GenerationCapabilities) -> tuple[int, int, str | None]:
    full = key if "_" in key else f"{key}_16_9"
    if full not in RESOLUTIONS:
        tiers = ", ".join(sorted({k.split("_", 1)[0] for k in RESOLUTIONS}))
        raise InvalidRequest(f"resolution {key!r} is not a key of the resolution table: a tier "
                             f"({tiers}), optionally with _16_9, _1_1, _9_16, _4_3 or _3_4",
                             param="resolution")
    width, height = RESOLUTIONS[full]
    divisor = caps.defaults.resolution_divisor
    if divisor <= 1:
        return width, height, None
    small = (_round16(width / divisor), _round16(height / divisor))
    note = (f"{key} served at {small[0]}x{small[1]}: a dev checkpoint (the table's "
            f"{width}x{height} divided by {divisor})")
    return small[0], small[1], note


def _round16(value: float) -> int:
    return max(16, int(round(value / 16)) * 16)


def _check_frames(num_frames: int, image: bool, key: str) -> None:
    if image:
        if num_frames != 1:
            raise InvalidRequest(f"text2image takes num_frames 1 (got {num_frames})",
                                 param="num_frames")
        return
    tier = key.split("_", 1)[0]
    ceiling = MAX_FRAMES[tier]
    if num_frames < MIN_VIDEO_FRAMES or (num_frames - 1) % 4 or num_frames > ceiling:
        raise InvalidRequest(f"num_frames must be 1 + 4k, at least {MIN_VIDEO_FRAMES} and at "
                             f"most {ceiling} for the {tier} tier (got {num_frames})",
                             param="num_frames")


def _indexes(indexes: list[int] | None, num_frames: int) -> list[int] | None:
    """Latent-frame indexes, sorted and deduplicated; each within the output's latent range."""
    if indexes is None:
        return None
    latent = (num_frames - 1) // 4 + 1
    out = sorted(set(indexes))
    if not out or out[0] < 0 or out[-1] >= latent:
        raise InvalidRequest(f"condition_frame_indexes_vision holds latent indexes from 0 to "
                             f"{latent - 1} for num_frames {num_frames} (got {indexes})",
                             param="condition_frame_indexes_vision")
    return out


def _action_job(req: InferRequest, caps: GenerationCapabilities,
                reference: str | None) -> NimJob:
    mode, params = req.model_mode, req.action_params
    if params is None:
        raise InvalidRequest(f"{mode} requires action_params", param="action_params")
    for name in ("resolution", "num_frames"):
        if getattr(req, name) is not None:
            raise InvalidRequest(f"{name} is not allowed for {mode}: an action run derives it "
                                 "(action_chunk_size + 1 frames, the observation's shape)",
                                 param=name)
    chunk = params.action_chunk_size
    if chunk % 4:
        raise InvalidRequest(f"action_params.action_chunk_size must be a positive multiple of 4 "
                             f"(got {chunk})", param="action_params.action_chunk_size")
    width = _action_width(params.domain_name, params.raw_action_dim)
    rows = _action_rows(mode, params.action, chunk, width)
    _refuse_state(mode, params)
    if params.action_space != "joint_pos":
        raise InvalidRequest("action_params.action_space: this pipeline (diffusers "
                             "Cosmos3OmniPipeline) has no action-space selection; send "
                             "joint_pos", param="action_params.action_space")
    base = DEFAULTS["action"]
    return NimJob(mode=mode, prompt=req.prompt or "", negative_prompt=req.negative_prompt,
                  reference=reference, seed=req.seed, width=0, height=0,
                  num_frames=chunk + 1, fps=req.fps or float(base["fps"]),
                  action={"domain_name": params.domain_name, "chunk": chunk, "rows": rows,
                          "tier": int(params.image_size), "width": width},
                  **_sampling(req, caps, base))


def _action_width(domain: str, raw_action_dim: int | None) -> int:
    width = DOMAIN_DIMS[domain]
    if raw_action_dim is not None and raw_action_dim != width:
        raise InvalidRequest(f"action_params.raw_action_dim must be {width} for domain "
                             f"{domain!r} (got {raw_action_dim})",
                             param="action_params.raw_action_dim")
    return width


def _action_rows(mode: str, rows: list[list[float]] | None, chunk: int,
                 width: int) -> list[list[float]] | None:
    if mode != "forward_dynamics":
        if rows is not None:
            raise InvalidRequest(f"action_params.action is for forward_dynamics; {mode} "
                                 "predicts it", param="action_params.action")
        return None
    if rows is None:
        raise InvalidRequest("forward_dynamics requires action_params.action: "
                             f"[{chunk}][{width}] numbers", param="action_params.action")
    if len(rows) != chunk or any(len(row) != width for row in rows):
        raise InvalidRequest(f"action_params.action must be [{chunk}][{width}] "
                             "(action_chunk_size rows of the domain's width)",
                             param="action_params.action")
    return rows


def _refuse_state(mode: str, params) -> None:
    used = [n for n in ("history_length", "use_state", "observation")
            if getattr(params, n) not in (None, False)]
    if not used:
        return
    if mode != "policy":
        raise InvalidRequest(f"action_params.{used[0]} is policy-only",
                             param=f"action_params.{used[0]}")
    raise InvalidRequest(f"action_params.{used[0]}: this pipeline (diffusers "
                         "Cosmos3OmniPipeline) takes no state input; the DROID specialist's "
                         "observation is not served", param=f"action_params.{used[0]}")
