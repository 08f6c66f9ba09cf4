"""Sampling defaults per model family (the api fills omitted request fields from these)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

DEV_MARKER = "worldserve_dev.json"


@dataclass(frozen=True)
class SamplingDefaults:
    width: int = 832
    height: int = 480
    num_frames: int = 81
    fps: int = 16
    num_inference_steps: int = 50
    guidance_scale: float = 5.0
    negative_prompt: str = ""
    seed: int = 42
    max_sequence_length: int = 512
    image_width: int = 832
    image_height: int = 480
    image_format: str = "png"
    image_response_format: str = "url"
    # /v1/infer resolution keys are served at the NIM table's size divided by this (dev: 16)
    resolution_divisor: int = 1

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# Wan 2.1/2.2 T2V at 480p, as the diffusers model cards use it.
WAN_DEFAULTS = SamplingDefaults()
# The tiny dev checkpoint: sizes and steps that run in tens of milliseconds on a CPU.
DEV_DEFAULTS = SamplingDefaults(width=64, height=64, num_frames=9, fps=8, num_inference_steps=4,
                                guidance_scale=1.0, max_sequence_length=64, image_width=64,
                                image_height=64)


# Cosmos3OmniPipeline.__call__'s own defaults (so an omitted field is the pipeline's default);
# images default to b64_json responses (spec §3.1).
COSMOS3_DEFAULTS = SamplingDefaults(width=1280, height=720, num_frames=189, fps=24,
                                    num_inference_steps=35, guidance_scale=6.0,
                                    image_width=1280, image_height=720,
                                    image_response_format="b64_json")
# The tiny dev Cosmos3 checkpoint: the pipeline's guidance, small sizes and few steps.
COSMOS3_DEV_DEFAULTS = SamplingDefaults(width=48, height=32, num_frames=9, fps=8,
                                        num_inference_steps=4, guidance_scale=6.0,
                                        image_width=32, image_height=32,
                                        image_response_format="b64_json", resolution_divisor=16)
FAMILY_DEFAULTS = {"cosmos3": (COSMOS3_DEFAULTS, COSMOS3_DEV_DEFAULTS)}


def sampling_defaults(model_dir: Path, family: str = "wan") -> SamplingDefaults:
    """Dev checkpoints (marker file) get the family's dev defaults (overridable by the
    marker's `sampling_defaults`); anything else gets the family's defaults (Wan's unless
    the family has its own)."""
    real, dev = FAMILY_DEFAULTS.get(family, (WAN_DEFAULTS, DEV_DEFAULTS))
    marker = model_dir / DEV_MARKER
    if not marker.is_file():
        return real
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError):
        return dev
    overrides = data.get("sampling_defaults") if isinstance(data, dict) else None
    if isinstance(overrides, dict):
        known = {k: v for k, v in overrides.items() if k in SamplingDefaults.__dataclass_fields__}
        return replace(dev, **known)
    return dev
