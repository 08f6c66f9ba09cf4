"""Load a Cosmos3 reasoner directory into the Qwen-VL runner (the same session cache, chunked
prefill and batched decode serve Omni, a Qwen3-VL, and Edge).

ModelOpt FP8 checkpoints, which transformers would load without their scales, load through
`worldserve.levers.fp8` (docs/generation.md, FP8).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from worldserve.levers import shared
from worldserve.levers.fp8.load import load_reasoner_model
from worldserve.models.cosmos3_reasoner.family import EDGE, OMNI
from worldserve.models.cosmos3_reasoner.sharing import WeightMismatch, tie_text_pathway
from worldserve.models.qwen_vl.processor import load_processor, load_vlm
from worldserve.models.qwen_vl.runner import QwenVLRunner
from worldserve.models.qwen_vl.vision import VideoStyle
from worldserve.models.types import ModelLoadError

logger = logging.getLogger(__name__)

# How each reasoner's processor writes a video into the prompt (qwen_vl.vision.VideoStyle): Omni
# as Qwen3-VL (a timestamp before each frame group), Edge one timestamped span per frame.
VIDEO_STYLES: dict[str, VideoStyle] = {OMNI: "timestamped", EDGE: "framewise"}


def load_runner(model_dir: Path, *, dtype: str = "float32", device: str = "cpu",
                generator: Any = None, fp8_compute: str = "auto") -> QwenVLRunner:
    """The registry's reasoner loader for a Cosmos3 reasoner directory.

    `generator`: the Cosmos3 generator transformer of the same directory, already loaded in
    this process on the same device; the reasoner then shares its LLM parameters
    (`sharing.tie_text_pathway`) instead of holding a second copy. ModelOpt FP8 weights load
    through `worldserve.levers.fp8` (transformers would drop their scales).
    """
    try:
        model = load_reasoner_model(model_dir, dtype, device, fp8_compute)
        if model is None:
            model, processor = load_vlm(model_dir, dtype=dtype, device=device)
        else:
            processor = load_processor(Path(model_dir))
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"cannot load the Cosmos3 reasoner from {model_dir}: "
                             f"{exc}") from exc
    if generator is not None:
        tie_text_pathway(model, generator, model.config.model_type)  # asked for: must work
    else:
        _share_published_generator(model, model_dir)
    return QwenVLRunner(model, processor, VIDEO_STYLES[model.config.model_type])


def _share_published_generator(model: Any, model_dir: Path) -> None:
    """In a colocated process: tie to the generator transformer the generation stage loaded
    from the same directory, if any (else, or when it cannot be shared, keep this copy)."""
    generator = shared.lookup(model_dir, shared.GENERATOR_TRANSFORMER)
    if generator is None:
        return
    try:
        tied = tie_text_pathway(model, generator, model.config.model_type)
    except WeightMismatch as exc:
        logger.warning("not sharing the generator's weights (%s); the reasoner keeps its own "
                       "copy", exc)
        return
    logger.info("reasoner shares %d LLM tensors with the generator transformer", tied)
