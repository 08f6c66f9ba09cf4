"""Public request -> the one validated `MediaRequest` (spec native-media.md §2.1, §3.1, §4.1).

Everything is resolved against the generation stage's declaration (`GenerationCapabilities`,
published at startup, so no round trip): omitted fields take its sampling defaults, the fields a
model must declare (sound, video conditioning, actions) are refused unless it does, and its
static rules (`worldserve/ipc/rules.py`) are checked before anything is relayed. What the
server changed on the way (a clamped `n`) is said in `MediaRequest.warnings`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from worldserve.api.jobs.world_actions import forward_dynamics, job_action
from worldserve.api.schemas.images import ImageGenerationRequest, SamplingFields
from worldserve.api.schemas.lora import parse_lora
from worldserve.api.schemas.videos import VideoCreateRequest
from worldserve.errors import InvalidRequest
from worldserve.ipc.capabilities import GenerationCapabilities, GenerationDefaults
from worldserve.ipc.messages import GenerationParams
from worldserve.ipc.rules import HorizonField, check_generation

MAX_OUTPUTS = 10
MAX_SIDE = 4096
MAX_STEPS = 1000
MAX_FRAMES = 1025
MAX_SEED = 2**63 - 1 - MAX_OUTPUTS  # seeds are signed 64-bit; `seed + i` for each output
QUALITY_TO_COMPRESSION = {"maximum": 100, "high": 90, "medium": 55, "low": 35}
IMAGE_FORMATS = ("png", "jpeg", "webp")
RESPONSE_FORMATS = ("url", "b64_json")
# Numbers with a range but no contract message: `>= 0` scales, `> 0` shifts and rates.
NON_NEGATIVE = ("guidance_scale", "guidance_scale_2", "true_cfg_scale")
POSITIVE = ("flow_shift",)
# `/v1/videos` fields a model must declare: (the declared capability, what it is, the fields).
DECLARED_FIELDS = (
    ("sound", "sound generation", ("generate_sound", "sound_duration")),
    ("video_conditioning", "video conditioning",
     ("condition_frame_indexes", "condition_frame_indexes_vision", "condition_video_keep")),
    ("action_generation", "action generation",
     ("action_mode", "domain_id", "domain_name", "raw_action_dim", "action_fps", "action",
      "action_view_point", "action_normalization", "resolution_tier")),
)


@dataclass
class MediaRequest:
    """One validated native media request: what `MediaService` runs (images, a video job)."""

    params: GenerationParams
    output_format: str
    compression: int
    fps: int = 24
    response_format: str = "url"
    model: str | None = None
    enhance_prompt: bool = False
    action: dict[str, Any] | None = None  # a forward-dynamics job's rows, as the job shows them
    remixed_from_video_id: str | None = None  # a remix: the job whose video conditions it
    warnings: list[str] = field(default_factory=list)  # said in X-Worldserve-Warning


def _positive(name: str, value: int | None, maximum: int | None = None) -> int | None:
    if value is None:
        return None
    if value <= 0:
        raise InvalidRequest(f"{name} must be positive", param=name)
    if maximum is not None and value > maximum:
        raise InvalidRequest(f"{name} must be at most {maximum} (got {value})", param=name)
    return value


def _check_ranges(req: Any) -> None:
    """400 for a number outside its range (negative guidance, NaN, a seed past 64 bits)."""
    for name in NON_NEGATIVE + POSITIVE + ("sound_duration",):
        value = getattr(req, name, None)
        if value is None:
            continue
        low_ok = value > 0 if name in POSITIVE else value >= 0
        if not (math.isfinite(value) and low_ok):
            bound = "> 0" if name in POSITIVE else ">= 0"
            raise InvalidRequest(f"{name} must be a finite number {bound} (got {value})",
                                 param=name)
    for seed in req.seed if isinstance(req.seed, list) else [req.seed]:
        if seed is not None and not -MAX_SEED <= seed <= MAX_SEED:
            raise InvalidRequest(f"seed must be an integer from {-MAX_SEED} to {MAX_SEED} "
                                 f"(got {seed})", param="seed")


def parse_size(
    size: str | None, width: int | None, height: int | None, default: tuple[int, int]
) -> tuple[int, int]:
    """`WIDTHxHEIGHT`; explicit width/height win over size (spec §2.1)."""
    w, h = default
    if size:
        text = size.strip().lower()
        ws, sep, hs = text.partition("x")
        if not (sep and ws.isdigit() and hs.isdigit() and int(ws) > 0 and int(hs) > 0):
            raise InvalidRequest("size must be formatted as positive WIDTHxHEIGHT", param="size")
        w, h = int(ws), int(hs)
    w = _positive("width", width, MAX_SIDE) or w
    h = _positive("height", height, MAX_SIDE) or h
    if w > MAX_SIDE or h > MAX_SIDE:
        raise InvalidRequest(
            f"size must be at most {MAX_SIDE}x{MAX_SIDE} (got {w}x{h})", param="size"
        )
    return w, h


def _seeds(req: SamplingFields, default_seed: int, warnings: list[str]) -> list[int]:
    """One seed per output. `n` is clamped to 1..10, not refused (spec §2.1): said in a
    warning, like a seed list cut to 10."""
    name = "n" if req.n is not None else "num_outputs_per_prompt"
    count = req.n if req.n is not None else req.num_outputs_per_prompt
    _positive("num_outputs_per_prompt", req.num_outputs_per_prompt)
    n = max(1, min(MAX_OUTPUTS, count if count is not None else 1))
    if count is not None and n != count:
        warnings.append(f"{name}={count} clamped to {n} (outputs per request: 1 to "
                        f"{MAX_OUTPUTS})")
    if isinstance(req.seed, list):
        if not req.seed:
            raise InvalidRequest("seed must not be an empty list", param="seed")
        if len(req.seed) > MAX_OUTPUTS:
            warnings.append(f"seed list of {len(req.seed)} cut to its first {MAX_OUTPUTS}")
        return [int(s) for s in req.seed[:MAX_OUTPUTS]]
    base = default_seed if req.seed is None else req.seed
    return [base + i for i in range(n)]


def _refuse_unavailable(req: SamplingFields) -> None:
    if req.enable_upscaling:
        raise InvalidRequest(
            "enable_upscaling is not available: this server has no upscaler configured",
            param="enable_upscaling",
        )
    if getattr(req, "enable_frame_interpolation", False):
        raise InvalidRequest(
            "enable_frame_interpolation is not available: this server has no "
            "frame interpolation model configured",
            param="enable_frame_interpolation",
        )


def _params(req: SamplingFields, defaults: GenerationDefaults, size: tuple[int, int],
            num_frames: int, prompt: str, warnings: list[str]) -> GenerationParams:
    _check_ranges(req)
    steps = _positive("num_inference_steps", req.num_inference_steps, MAX_STEPS)
    max_len = _positive("max_sequence_length", req.max_sequence_length, 4096)
    return GenerationParams(
        prompt=prompt, width=size[0], height=size[1], num_frames=num_frames,
        num_inference_steps=steps or defaults.num_inference_steps,
        guidance_scale=_or(req.guidance_scale, defaults.guidance_scale),
        guidance_scale_2=req.guidance_scale_2,
        negative_prompt=_or(req.negative_prompt, defaults.negative_prompt),
        seeds=_seeds(req, defaults.seed, warnings),
        max_sequence_length=max_len or defaults.max_sequence_length,
        lora=parse_lora(req.lora),
        step_cache=req.enable_teacache,
    )


def _flow_shift(params: GenerationParams, req: SamplingFields, caps: GenerationCapabilities,
                warnings: list[str]) -> None:
    """A request's flow_shift reaches a model that declares per-request shifts; elsewhere it is
    said to be ignored (the scheduler's configured shift applies)."""
    if req.flow_shift is None:
        return
    if caps.flow_shift:
        params.flow_shift = req.flow_shift
    else:
        warnings.append("flow_shift ignored: this model's scheduler shift is fixed")


def _or(value: Any, default: Any) -> Any:
    return value if value is not None else default


def require_prompt(prompt: str | None) -> str:
    if prompt is None or not prompt.strip():
        raise InvalidRequest("prompt is required", param="prompt")
    return prompt


def compression_of(req: SamplingFields, default: int) -> int:
    if req.output_compression is not None:
        return req.output_compression
    return QUALITY_TO_COMPRESSION.get(req.output_quality or "default", default)


def resolve_image(req: ImageGenerationRequest, images: list[bytes],
                  caps: GenerationCapabilities, *, default_response_format: str) -> MediaRequest:
    """An image request (conditioned on `images` for edits)."""
    prompt = require_prompt(req.prompt)
    defaults = caps.defaults
    response_format = req.response_format or default_response_format
    if response_format not in RESPONSE_FORMATS:
        raise InvalidRequest(
            f"response_format={response_format} is not supported", param="response_format"
        )
    if req.output_format is not None and req.output_format not in IMAGE_FORMATS:
        raise InvalidRequest(
            f"output_format={req.output_format} is not supported", param="output_format"
        )
    output_format = req.output_format or (
        "png" if req.background == "transparent" else defaults.image_format
    )
    _refuse_unavailable(req)
    _positive("num_frames", req.num_frames)
    size = parse_size(req.size, req.width, req.height,
                      (defaults.image_width, defaults.image_height))
    warnings: list[str] = []
    params = _params(req, defaults, size, 1, prompt, warnings)
    params.condition_images = images
    _flow_shift(params, req, caps, warnings)
    check_generation(params, caps)
    return MediaRequest(params=params, output_format=output_format,
                        compression=compression_of(req, 75), response_format=response_format,
                        model=req.model, enhance_prompt=bool(req.enhance_prompt),
                        warnings=warnings)


def resolve_video(req: VideoCreateRequest, images: list[bytes], video: bytes | None,
                  caps: GenerationCapabilities) -> MediaRequest:
    """A video job (conditioned on an image or a video, or driven by actions)."""
    _refuse_undeclared(req, caps)
    prompt = require_prompt(req.prompt)
    _refuse_unavailable(req)
    defaults = caps.defaults
    fps = _positive("fps", req.fps, 240) or defaults.fps
    seconds = _positive("seconds", req.seconds, 600) or 4
    num_frames = _positive("num_frames", req.num_frames, MAX_FRAMES) or min(
        fps * seconds, MAX_FRAMES
    )
    if req.num_frames is None and caps.exact_num_frames:  # fps x seconds, snapped to the VAE
        stride = max(1, caps.temporal_stride)
        num_frames = max(1, (num_frames - 1) // stride * stride + 1)
    size = parse_size(req.size, req.width, req.height, (defaults.width, defaults.height))
    warnings: list[str] = []
    params = _params(req, defaults, size, num_frames, prompt, warnings)
    _flow_shift(params, req, caps, warnings)
    horizon_field = _video_fields(params, req, caps, fps, images, video)
    check_generation(params, caps, horizon_field)
    return MediaRequest(params=params, output_format="mp4", compression=compression_of(req, 50),
                        fps=fps, model=req.model, enhance_prompt=bool(req.enhance_prompt),
                        action=job_action(params.action, caps) if params.action else None,
                        warnings=warnings)


def _video_fields(params: GenerationParams, req: VideoCreateRequest,
                  caps: GenerationCapabilities, fps: int, images: list[bytes],
                  video: bytes | None) -> HorizonField:
    """The conditioning and the declared fields into `params`; returns the field an action
    run's horizon came from."""
    params.fps = float(fps)
    params.condition_images = images
    params.condition_video = video
    params.generate_sound = bool(req.generate_sound)
    indexes = req.condition_frame_indexes_vision or req.condition_frame_indexes
    params.condition_frame_indexes_vision = list(indexes) if indexes is not None else None
    params.condition_video_keep = req.condition_video_keep
    if req.action_mode is None and req.action is None:
        return "action_horizon"
    params.action, horizon_field = forward_dynamics(req, caps)
    params.num_frames = params.action.chunk_size + 1  # the clip an action run produces
    if params.num_frames > MAX_FRAMES:
        raise InvalidRequest(f"forward dynamics rolls out at most {MAX_FRAMES - 1} action rows "
                             f"(got {params.action.chunk_size})", param=horizon_field)
    return horizon_field


def _refuse_undeclared(req: VideoCreateRequest, caps: GenerationCapabilities) -> None:
    """A field whose capability the model does not declare -> 400 naming the field."""
    for capability, what, names in DECLARED_FIELDS:
        if getattr(caps, capability) not in (None, False):
            continue
        for name in names:
            if getattr(req, name) not in (None, False):
                raise InvalidRequest(f"{name}: this model ({caps.pipeline}) does not support "
                                     f"{what}", param=name)
