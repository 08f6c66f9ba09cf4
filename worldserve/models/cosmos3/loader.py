"""Load a Cosmos3 generator directory: layout checks, quantisation, the safety checker.

Accepted layouts (docs/generation.md says which were verified with tiny checkpoints):

- plain diffusers: `model_index.json` (`_class_name` Cosmos3OmniPipeline) with `transformer/`,
  `vae/`, `scheduler/`, `text_tokenizer/` and optionally `sound_tokenizer/`;
- published (one directory for diffusers and transformers): the same, plus a root
  `config.json` (the reasoner, `model_type` cosmos3_omni), processor files,
  `modular_model_index.json`, sharded transformer weights with an index, and for ModelOpt
  FP8 checkpoints a root `modelopt_state.pth` and a `quantization_config` in
  `transformer/config.json`.

ModelOpt FP8 transformer weights load through `worldserve.levers.fp8` (W8A16 dequantised at
load, or W8A8 on CUDA sm89+ through ModelOpt's restore); an unknown quantisation format or a
quantised linear without its scale stops startup with a message naming it.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worldserve.models.detect import MODEL_INDEX, read_json
from worldserve.models.types import ModelLoadError

REQUIRED_COMPONENTS = ("transformer", "vae", "scheduler", "text_tokenizer")
MODELOPT_STATE = "modelopt_state.pth"
FP8_DTYPES = ("F8_E4M3", "F8_E5M2", "F8_E8M0")
MAX_HEADER_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Quantisation:
    """What the checkpoint says about quantised transformer weights."""

    method: str  # "modelopt", "fp8", ...
    evidence: str  # which file said so


def check_layout(model_dir: Path) -> None:
    """Every required component folder exists with its config; else ModelLoadError."""
    index = read_json(model_dir / MODEL_INDEX) or {}
    for name in REQUIRED_COMPONENTS:
        entry = index.get(name)
        if not (isinstance(entry, list) and entry and entry[0]):
            raise ModelLoadError(f"{model_dir}: model_index.json names no {name!r} component; a "
                                 "Cosmos3 generator needs " + ", ".join(REQUIRED_COMPONENTS))
        if not (model_dir / name).is_dir():
            raise ModelLoadError(f"{model_dir}: the {name}/ folder that model_index.json names "
                                 "is missing (an incomplete download?)")


def detect_quantisation(model_dir: Path) -> Quantisation | None:
    """Quantised transformer weights: a config `quantization_config`, a ModelOpt state file,
    or FP8 tensors in the safetensors headers."""
    config = read_json(model_dir / "transformer" / "config.json") or {}
    quant = config.get("quantization_config")
    if isinstance(quant, dict):
        method = str(quant.get("quant_method") or quant.get("quant_algo") or "unknown")
        return Quantisation(method, "transformer/config.json quantization_config")
    for path in (model_dir / MODELOPT_STATE, model_dir / "transformer" / MODELOPT_STATE):
        if path.is_file():
            return Quantisation("modelopt", str(path.relative_to(model_dir)))
    for shard in sorted((model_dir / "transformer").glob("*.safetensors")):
        dtypes = _safetensors_dtypes(shard)
        fp8 = sorted(dtypes.intersection(FP8_DTYPES))
        if fp8:
            return Quantisation("fp8", f"{shard.relative_to(model_dir)} holds {fp8[0]} tensors")
    return None


def _safetensors_dtypes(path: Path) -> set[str]:
    """Tensor dtypes named in a safetensors header (reads the header only)."""
    try:
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > MAX_HEADER_BYTES:
                return set()
            header = json.loads(f.read(length))
    except (OSError, ValueError, struct.error):
        return set()
    return {value.get("dtype") for key, value in header.items()
            if key != "__metadata__" and isinstance(value, dict)}


def check_safety_checker(enabled: bool) -> None:
    """With the safety checker configured on, the cosmos_guardrail package must import."""
    if not enabled:
        return
    try:
        import cosmos_guardrail  # noqa: F401
    except ImportError:
        raise ModelLoadError(
            "stages.generation.safety_checker is true but the cosmos_guardrail package is not "
            "installed: pip install cosmos-guardrail (or set safety_checker: false)") from None


def load_pipeline(model_dir: Path, dtype: Any, device: str, *,
                  safety_checker: bool = False, fp8_compute: str = "auto") -> Any:
    """`Cosmos3OmniPipeline.from_pretrained` on a checked local directory, safety checker off
    unless configured, progress bars off (the engine reports per-step progress)."""
    from diffusers import Cosmos3OmniPipeline
    from diffusers.utils import logging as diffusers_logging

    from worldserve.levers.fp8.load import load_generator_transformer
    from worldserve.models.common import direct_device_map, require_local_dir, resolve_dtype

    path = require_local_dir(model_dir)
    check_layout(path)
    check_safety_checker(safety_checker)
    diffusers_logging.disable_progress_bar()
    # FP8 (ModelOpt) weights: built here for W8A16, or None (plain, or W8A8 restored by
    # diffusers after ModelOpt's hook); an unknown format or a missing scale raises.
    transformer = load_generator_transformer(path, dtype, device, fp8_compute)
    components = {} if transformer is None else {"transformer": transformer}
    try:
        pipe = Cosmos3OmniPipeline.from_pretrained(
            path, dtype=resolve_dtype(dtype), local_files_only=True,
            enable_safety_checker=safety_checker, device_map=direct_device_map(device),
            **components)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"{path}: cannot load the Cosmos3 generator: {exc}") from exc
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device)  # a no-op for what device_map placed already
