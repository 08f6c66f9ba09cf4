"""A Cosmos3 directory's NIM profile: `model_variant` and precision (cookbook support-matrix.md),
read from its files only.

* Size: the text width of the transformer (generator `transformer/config.json`, reasoner
  `config.json` `text_config`): Cosmos3-Nano adapts Qwen3-VL-8B (hidden 4096), Cosmos3-Super
  Qwen3-VL-32B (hidden 5120); at least `SUPER_HIDDEN_SIZE` is `super`, anything smaller `nano`
  (the tiny dev checkpoints: hidden 32, hence `nano`). An Edge reasoner (`cosmos3_edge`) or a
  squared-ReLU generator is `edge`.
* Specialists, from the directory name as published (`Cosmos3-Super-Text2Image`,
  `Cosmos3-Super-Image2Video`, `Cosmos3-Nano-Policy-DROID`): `-t2i`, `-i2v`, `nano-droid`; a
  distilled checkpoint (`distilled_sigmas` in `modular_model_index.json`, or `4step` in its name)
  adds `-4step`. These rules follow the published names; no specialist checkpoint was read here.
* Precision: `fp8` / `nvfp4` for quantised weights (a `quantization_config`, a ModelOpt state
  file or FP8 tensors), else the serving dtype (`bf16`, `fp16`, `fp32`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from worldserve.models.detect import read_json
from worldserve.models.types import DTYPE_PRECISION, ModelProfile

SUPER_HIDDEN_SIZE = 5120
MODULAR_INDEX = "modular_model_index.json"
# directory-name marker -> (variant suffix or full variant, the only model_modes it serves)
SPECIALISTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("policydroid", "nano-droid", ("policy",)),
    ("text2image", "-t2i", ("text2image",)),
    ("image2video", "-i2v", ("image2video",)),
)


def generator_profile(model_dir: Path, dtype: str) -> ModelProfile:
    """The generator's profile (`transformer/config.json`, quantisation, the directory name)."""
    from worldserve.models.cosmos3.loader import detect_quantisation

    config = read_json(model_dir / "transformer" / "config.json") or {}
    size = "edge" if config.get("hidden_act") == "relu2" else _size(config.get("hidden_size"))
    variant, modes = _specialist(model_dir, size)
    quant = detect_quantisation(model_dir)
    return ModelProfile(variant, _precision(quant.method if quant else None, dtype), modes)


def reasoner_profile(model_dir: Path, dtype: str) -> ModelProfile:
    """The reasoner's profile (`config.json` model type and text width, quantisation)."""
    config = read_json(model_dir / "config.json") or {}
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    edge = config.get("model_type") == "cosmos3_edge"
    variant = "edge" if edge else _size(text.get("hidden_size"))
    quant = config.get("quantization_config")
    method = None
    if isinstance(quant, dict):
        method = str(quant.get("quant_algo") or quant.get("quant_method") or "fp8")
    elif (model_dir / "modelopt_state.pth").is_file():
        method = "fp8"
    return ModelProfile(variant, _precision(method, dtype))


def _size(hidden_size: Any) -> str:
    return "super" if isinstance(hidden_size, int) and hidden_size >= SUPER_HIDDEN_SIZE \
        else "nano"


def _specialist(model_dir: Path, size: str) -> tuple[str, tuple[str, ...] | None]:
    name = re.sub(r"[^a-z0-9]", "", model_dir.resolve().name.lower())
    for marker, variant, modes in SPECIALISTS:
        if marker in name:
            full = variant if not variant.startswith("-") else size + variant
            return full + ("-4step" if _distilled(model_dir, name) else ""), modes
    return size, None


def _distilled(model_dir: Path, name: str) -> bool:
    return "4step" in name or "distilled_sigmas" in str(read_json(model_dir / MODULAR_INDEX))


def _precision(method: str | None, dtype: str) -> str:
    if method is None:
        return DTYPE_PRECISION.get(dtype, dtype)
    return "nvfp4" if "fp4" in method.lower() else "fp8"
