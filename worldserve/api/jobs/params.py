"""Public request -> resolved generation parameters (spec native-media.md §2.1, §3.1, §4.1).

Omitted fields take the model's sampling defaults, which the generation stage publishes in its
capabilities at startup (`defaults`), so no round trip is needed.
"""

from __future__ import annotations

from dataclasses import dataclass

from worldserve.api.schemas.images import ImageGenerationRequest, SamplingFields
from worldserve.api.schemas.lora import parse_lora
from worldserve.api.schemas.videos import VideoCreateRequest
from worldserve.errors import InvalidRequest
from worldserve.ipc.capabilities import GenerationDefaults
from worldserve.ipc.messages import GenerationParams

MAX_OUTPUTS = 10
MAX_SIDE = 4096
MAX_STEPS = 1000
MAX_FRAMES = 1025
QUALITY_TO_COMPRESSION = {"maximum": 100, "high": 90, "medium": 55, "low": 35}
IMAGE_FORMATS = ("png", "jpeg", "webp")
RESPONSE_FORMATS = ("url", "b64_json")


@dataclass
class ResolvedRequest:
    params: GenerationParams
    output_format: str
    compression: int
    fps: int = 24
    response_format: str = "url"


def _positive(name: str, value: int | None, maximum: int | None = None) -> int | None:
    if value is None:
        return None
    if value <= 0:
        raise InvalidRequest(f"{name} must be positive", param=name)
    if maximum is not None and value > maximum:
        raise InvalidRequest(f"{name} must be at most {maximum} (got {value})", param=name)
    return value


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


def _seeds(req: SamplingFields, default_seed: int) -> list[int]:
    count = req.n if req.n is not None else req.num_outputs_per_prompt
    _positive("num_outputs_per_prompt", req.num_outputs_per_prompt)
    n = max(1, min(MAX_OUTPUTS, count if count is not None else 1))  # clamped, not rejected
    if isinstance(req.seed, list):
        if not req.seed:
            raise InvalidRequest("seed must not be an empty list", param="seed")
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


def _params(
    req: SamplingFields,
    defaults: GenerationDefaults,
    size: tuple[int, int],
    num_frames: int,
    prompt: str,
) -> GenerationParams:
    steps = _positive("num_inference_steps", req.num_inference_steps, MAX_STEPS)
    max_len = _positive("max_sequence_length", req.max_sequence_length, 4096)
    return GenerationParams(
        prompt=prompt,
        width=size[0],
        height=size[1],
        num_frames=num_frames,
        num_inference_steps=steps or defaults.num_inference_steps,
        guidance_scale=req.guidance_scale
        if req.guidance_scale is not None
        else defaults.guidance_scale,
        guidance_scale_2=req.guidance_scale_2,
        negative_prompt=req.negative_prompt
        if req.negative_prompt is not None
        else defaults.negative_prompt,
        seeds=_seeds(req, defaults.seed),
        max_sequence_length=max_len or defaults.max_sequence_length,
        lora=parse_lora(req.lora),
    )


def require_prompt(prompt: str | None) -> str:
    if prompt is None or not prompt.strip():
        raise InvalidRequest("prompt is required", param="prompt")
    return prompt


def compression_of(req: SamplingFields, default: int) -> int:
    if req.output_compression is not None:
        return req.output_compression
    return QUALITY_TO_COMPRESSION.get(req.output_quality or "default", default)


def resolve_image(
    req: ImageGenerationRequest, defaults: GenerationDefaults, *, default_response_format: str
) -> ResolvedRequest:
    prompt = require_prompt(req.prompt)
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
    size = parse_size(
        req.size, req.width, req.height, (defaults.image_width, defaults.image_height)
    )
    return ResolvedRequest(
        params=_params(req, defaults, size, 1, prompt),
        output_format=output_format,
        compression=compression_of(req, 75),
        response_format=response_format,
    )


def resolve_video(req: VideoCreateRequest, defaults: GenerationDefaults) -> ResolvedRequest:
    prompt = require_prompt(req.prompt)
    _refuse_unavailable(req)
    fps = _positive("fps", req.fps, 240) or defaults.fps
    seconds = _positive("seconds", req.seconds, 600) or 4
    num_frames = _positive("num_frames", req.num_frames, MAX_FRAMES) or min(
        fps * seconds, MAX_FRAMES
    )
    size = parse_size(req.size, req.width, req.height, (defaults.width, defaults.height))
    return ResolvedRequest(
        params=_params(req, defaults, size, num_frames, prompt),
        output_format="mp4",
        compression=compression_of(req, 50),
        fps=fps,
    )
