"""Public schemas of the image routes (spec native-media.md §3).

Unknown keys are accepted (upstream request models allow extra keys, spec §0.3) and ignored
unless the model declares them. Bounds whose violation the contract answers with a 400 and a
fixed message (size, positivity) are checked in `jobs.params`, not here.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# SGLang's `generator_device` names the torch device its seeded generator draws noise on.
GENERATOR_DEVICE = re.compile(r"cpu|cuda(:[0-9]{1,2})?")
# OpenAI's image `quality` and `style` values (gpt-image and dall-e): accepted, and said to have
# no effect here when not "auto"; anything else is a 400 naming the field.
QUALITIES = ("auto", "standard", "hd", "high", "medium", "low")
STYLES = ("vivid", "natural")


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

    @field_validator("generator_device")
    @classmethod
    def _device(cls, value: str | None) -> str | None:
        if value is not None and not GENERATOR_DEVICE.fullmatch(value):
            raise ValueError(f"must be 'cpu' or 'cuda' (got {value[:32]!r})")
        return value

    def compat_warnings(self) -> list[str]:
        """What SGLang / OpenAI fields this request sends that do not act here, said in
        X-Worldserve-Warning (the request runs; nothing is silently different)."""
        sent = "generator_device" in self.model_fields_set  # the default is SGLang's "cuda"
        if not sent or self.generator_device in (None, "cpu"):
            return []
        return [f"generator_device {self.generator_device!r} ignored: the initial noise is "
                "drawn on the CPU from the seed (the same seed gives the same output on any "
                "device)"]


class ImageGenerationRequest(SamplingFields):
    quality: str | None = "auto"
    response_format: str | None = None
    style: str | None = None
    background: Literal["auto", "transparent", "opaque"] | None = "auto"
    output_format: str | None = None
    user: str | None = None
    num_frames: int | None = None

    @field_validator("quality")
    @classmethod
    def _quality(cls, value: str | None) -> str | None:
        if value is not None and value not in QUALITIES:
            raise ValueError(f"must be one of {', '.join(QUALITIES)} (got {value[:32]!r})")
        return value

    @field_validator("style")
    @classmethod
    def _style(cls, value: str | None) -> str | None:
        if value is not None and value not in STYLES:
            raise ValueError(f"must be one of {', '.join(STYLES)} (got {value[:32]!r})")
        return value

    def compat_warnings(self) -> list[str]:
        said = super().compat_warnings()
        if self.quality not in (None, "auto"):
            said.append(f"quality {self.quality!r} has no effect on this model (steps: "
                        "num_inference_steps; file size: output_quality)")
        if self.style is not None:
            said.append(f"style {self.style!r} has no effect on this model")
        if self.background == "transparent":
            said.append("background 'transparent': the image is a PNG without transparency "
                        "(this model generates no alpha channel)")
        return said


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
