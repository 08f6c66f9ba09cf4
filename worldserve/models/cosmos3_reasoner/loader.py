"""Load a Cosmos3 reasoner directory into the Qwen-VL runner (the same session cache, chunked
prefill and batched decode serve Omni, a Qwen3-VL, and Edge).

Checks first what would otherwise fail deep inside transformers: a quantised (ModelOpt FP8)
checkpoint on a device that cannot run it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from worldserve.models import shared
from worldserve.models.cosmos3_reasoner.family import EDGE, OMNI
from worldserve.models.cosmos3_reasoner.sharing import WeightMismatch, tie_text_pathway
from worldserve.models.detect import read_json
from worldserve.models.qwen_vl.processor import load_vlm
from worldserve.models.qwen_vl.runner import QwenVLRunner
from worldserve.models.qwen_vl.vision import VideoStyle
from worldserve.models.types import ModelLoadError

logger = logging.getLogger(__name__)

MODELOPT_STATE = "modelopt_state.pth"
# How each reasoner's processor writes a video into the prompt (qwen_vl.vision.VideoStyle): Omni
# as Qwen3-VL (a timestamp before each frame group), Edge one timestamped span per frame.
VIDEO_STYLES: dict[str, VideoStyle] = {OMNI: "timestamped", EDGE: "framewise"}


def load_runner(model_dir: Path, *, dtype: str = "float32", device: str = "cpu",
                generator: Any = None) -> QwenVLRunner:
    """The registry's reasoner loader for a Cosmos3 reasoner directory.

    `generator`: the Cosmos3 generator transformer of the same directory, already loaded in
    this process on the same device; the reasoner then shares its LLM parameters
    (`sharing.tie_text_pathway`) instead of holding a second copy.
    """
    quantization = quantization_method(model_dir)
    if quantization and not str(device).startswith("cuda"):
        raise ModelLoadError(
            f"{model_dir} holds {quantization}-quantised weights, which need a CUDA GPU; "
            f"the reasoner stage was configured for device {device!r}. Use a bf16 checkpoint "
            "on CPU, or serve this one on a GPU")
    try:
        model, processor = load_vlm(model_dir, dtype=dtype, device=device)
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


def quantization_method(model_dir: Path) -> str | None:
    """"fp8" (or the config's `quant_method`) when the checkpoint is quantised, else None."""
    model_dir = Path(model_dir)
    config = read_json(model_dir / "config.json") or {}
    quant = config.get("quantization_config")
    if isinstance(quant, dict):
        return str(quant.get("quant_method") or quant.get("quant_algo") or "unknown")
    if (model_dir / MODELOPT_STATE).is_file():
        return "ModelOpt fp8"
    return None
