"""Cosmos3 (diffusers `Cosmos3OmniPipeline`): images, videos with sound, robot actions; on the
realtime stage (when configured there), camera_pose forward-dynamics world sessions."""

from __future__ import annotations

from pathlib import Path

from worldserve.ipc.capabilities import GenerationDefaults
from worldserve.models.detect import diffusers_class
from worldserve.models.dev import DEV_LIMITS
from worldserve.models.types import ModelFamily

PIPELINE_CLASS = "Cosmos3OmniPipeline"

# The resolution template the Generator NIM serves (api/nim/infer_rules.py RESOLUTIONS,
# MAX_FRAMES): sides up to 1280, frames up to 1280x720 (960x960, 1104x832), 197 frames at 720p
# and 397 at 256p; a clip at most as large as 720p x 197 frames.
LIMITS = dict(max_width=1280, max_height=1280, max_pixels=1280 * 720, max_num_frames=397,
              max_video_pixels=1280 * 720 * 197)

# Cosmos3OmniPipeline.__call__'s own defaults (so an omitted field is the pipeline's default);
# images default to b64_json responses (spec §3.1).
DEFAULTS = GenerationDefaults(width=1280, height=720, num_frames=189, fps=24,
                              num_inference_steps=35, guidance_scale=6.0, max_sequence_length=512,
                              image_width=1280, image_height=720,
                              image_response_format="b64_json", **LIMITS)
# The tiny dev Cosmos3 checkpoint: the pipeline's guidance, small sizes and few steps; the
# NIM's resolution keys at a sixteenth of their size (docs/nim.md: 720_16_9 -> 80x48).
DEV_DEFAULTS = GenerationDefaults(width=48, height=32, num_frames=9, fps=8, num_inference_steps=4,
                                  guidance_scale=6.0, max_sequence_length=512, image_width=32,
                                  image_height=32, image_response_format="b64_json",
                                  resolution_divisor=16, **DEV_LIMITS)


# Exact (non-quantised) attention only: the int8/fp8 SageAttention kernels break the
# mixture-of-transformers attention, whose understanding and generation K/V differ widely in
# range (xDiT's Cosmos3 runner refuses them: ">50% relative error per layer").
ATTENTION_BACKENDS = frozenset({
    "native", "flex", "xformers", "_native_cudnn", "_native_efficient", "_native_flash",
    "_native_math", "flash", "flash_hub", "flash_varlen", "flash_varlen_hub", "flash_4_hub",
    "_flash_3", "_flash_varlen_3", "_flash_3_hub", "_flash_3_varlen_hub", "aiter_fa2_hub"})


def detect(model_dir: Path) -> bool:
    return diffusers_class(model_dir) == PIPELINE_CLASS


FAMILY = ModelFamily(
    name="cosmos3",
    detect=detect,
    loaders={"generation": "worldserve.models.cosmos3.runner:load_runner",
             "realtime": "worldserve.models.cosmos3.world:load_runner",
             # one rank of a generation rank group (stages.generation.parallel)
             "generation_ranks": "worldserve.models.cosmos3.parallel:load_rank_runner"},
    explicit_kinds=frozenset({"realtime", "generation_ranks"}),
    profiles={"generation": "worldserve.models.cosmos3.profile:generator_profile"},
    attention_backends=ATTENTION_BACKENDS,
)
