"""Public schemas of the image routes (spec native-media.md §3).

Unknown keys are accepted (upstream request models allow extra keys, spec §0.3) and ignored
unless the model declares them. Bounds whose violation the contract answers with a 400 and a
fixed message (size, positivity) are checked in `jobs.params`, not here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Open(BaseModel):
    # extra="allow": the contract passes unknown keys through (spec §0.3).
    model_config = ConfigDict(extra="allow")


class SamplingFields(_Open):
    """Fields images and videos share."""

    prompt: str | None = None
    model: str | None = None
    n: int | None = None
    num_outputs_per_prompt: int | None = None
    size: str | None = None
    width: int | None = None
    height: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    guidance_scale_2: float | None = None
    true_cfg_scale: float | None = None
    negative_prompt: str | None = None
    seed: int | list[int] | None = None
    generator_device: str | None = "cuda"
    output_quality: Literal["maximum", "high", "medium", "low", "default"] | None = "default"
    output_compression: int | None = Field(default=None, ge=0, le=100)
    # Step caching for this request (SGLang's field): true / false; omitted: the server's
    # default (stages.generation.step_cache.default). A 400 where the model cannot cache.
    enable_teacache: bool | None = None
    max_sequence_length: int | None = None
    flow_shift: float | None = None
    enable_upscaling: bool | None = False
    upscaling_scale: int | None = 4
    diffusers_kwargs: dict[str, Any] | None = None
    enhance_prompt: bool | None = False
    # Loaded LoRA adapter(s) to apply: "name", {"name", "scale"} or a list (schemas/lora.py).
    lora: Any = None


class ImageGenerationRequest(SamplingFields):
    quality: str | None = "auto"
    response_format: str | None = None
    style: str | None = None
    background: Literal["auto", "transparent", "opaque"] | None = "auto"
    output_format: str | None = None
    user: str | None = None
    num_frames: int | None = None


class ImageData(BaseModel):
    b64_json: str | None = None
    url: str | None = None
    revised_prompt: str | None = None
    file_path: str | None = None


class ImageResponse(BaseModel):
    id: str
    created: int
    data: list[ImageData]
    peak_memory_mb: float | None = None
    inference_time_s: float | None = None
    step_cache: dict[str, Any] | None = None  # {method, num_forwards, num_forwards_skipped}
    usage: dict[str, int] | None = None
