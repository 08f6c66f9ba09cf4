"""Which quantised-weights format a checkpoint folder holds, read from its files only.

Two ModelOpt FP8 layouts are recognised (shared/notes/gpu-readiness.md §1):

- **native** (what `mtq.quantize` + `mtq.compress` + `save_pretrained` writes): FP8 E4M3
  `weight` tensors with `weight_quantizer._scale` and `input_quantizer._amax` buffers, plus a
  `modelopt_state.pth` beside the weights (or at the checkpoint root, as the published
  Cosmos3-Nano `fp8` revision has it);
- **exported** (ModelOpt's HF export, what TensorRT-LLM and vLLM read): FP8 E4M3 `weight` with
  `weight_scale` (and `input_scale`), and a `quantization_config` with `quant_method: modelopt`
  and `quant_algo` (or diffusers' `quant_type`) `FP8`.

Anything else that says it is quantised (another `quant_method` or algorithm, FP8 tensors with
no scales, a quantisation config over plain weights) is a `Fp8FormatError` naming what was
found: a quantised checkpoint is never loaded as if it were plain.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from worldserve.models.detect import read_json, read_safetensors_header
from worldserve.models.types import ModelLoadError

MODELOPT_STATE = "modelopt_state.pth"
FP8_E4M3 = "F8_E4M3"
FP8_DTYPES = ("F8_E4M3", "F8_E5M2", "F8_E8M0")
# Tensor-name suffixes of the two layouts (a quantised linear `prefix.weight` has these beside it).
NATIVE_SCALE = "weight_quantizer._scale"
NATIVE_INPUT_AMAX = "input_quantizer._amax"
EXPORTED_SCALE = "weight_scale"
EXPORTED_INPUT_SCALE = "input_scale"
KNOWN_METHODS = ("modelopt",)
KNOWN_ALGOS = ("FP8",)

Layout = Literal["modelopt_native", "modelopt_exported"]


class Fp8FormatError(ModelLoadError):
    """The checkpoint is quantised in a way worldserve does not load (the message says which)."""


@dataclass(frozen=True)
class QuantFormat:
    """A recognised ModelOpt FP8 checkpoint folder."""

    layout: Layout
    weights_dir: Path  # the folder holding the safetensors shards
    num_fp8_weights: int  # FP8 `*.weight` tensors in the headers
    state_file: Path | None  # the modelopt_state.pth found (component folder first, then root)
    evidence: str  # what said so, for log lines and `worldserve check`
    quant_config: dict[str, Any] | None = None  # the config's quantization_config, if any

    def describe(self) -> str:
        return f"ModelOpt FP8 ({self.layout.removeprefix('modelopt_')} layout; {self.evidence})"


def detect(weights_dir: Path, config_file: Path, root: Path | None = None) -> QuantFormat | None:
    """The format of the weights in `weights_dir` (config in `config_file`; a root
    `modelopt_state.pth` is looked for in `root` too); None for plain weights."""
    weights_dir = Path(weights_dir)
    config = read_json(Path(config_file)) or {}
    quant = config.get("quantization_config")
    if quant is not None:
        _check_quant_config(quant, Path(config_file))
    headers = _headers(weights_dir)
    names = {name for header in headers.values() for name in header}
    fp8_by_dtype = _fp8_tensors(headers)
    state_file = next((p for p in _state_candidates(weights_dir, root) if p.is_file()), None)
    if not fp8_by_dtype and not any(n.endswith(f".{NATIVE_SCALE}") for n in names):
        if quant is not None:
            raise Fp8FormatError(f"{weights_dir}: {config_file.name} quantization_config says "
                                 "the weights are quantised, but no FP8 tensors are in the "
                                 "safetensors files (an incomplete or fake-quantised export?); "
                                 "worldserve loads compressed ModelOpt FP8 checkpoints or plain "
                                 "ones")
        # A modelopt_state.pth beside plain weights (e.g. the root one of a checkpoint whose
        # reasoner weights are BF16): nothing is quantised here, the weights load as they are.
        return None
    other = sorted(set(fp8_by_dtype) - {FP8_E4M3})
    if other:
        raise Fp8FormatError(f"{weights_dir}: {other[0]} tensors (e.g. "
                             f"{fp8_by_dtype[other[0]][0]}); worldserve loads FP8 E4M3 only")
    fp8_names = fp8_by_dtype.get(FP8_E4M3, [])
    return QuantFormat(_layout(weights_dir, names), weights_dir,
                       sum(n.endswith(".weight") for n in fp8_names), state_file,
                       _evidence(quant, state_file, len(fp8_names)), quant)


def _check_quant_config(quant: Any, config_file: Path) -> None:
    if not isinstance(quant, dict):
        raise Fp8FormatError(f"{config_file}: quantization_config is {quant!r}, not an object")
    method = quant.get("quant_method")
    if method is not None and str(method).lower() not in KNOWN_METHODS:
        raise Fp8FormatError(f"{config_file}: quantization_config quant_method {method!r} is not "
                             "one worldserve loads (ModelOpt FP8: quant_method 'modelopt'); "
                             "refusing rather than loading the weights as plain ones")
    algo = quant.get("quant_algo") or quant.get("quant_type")
    if algo is None and method is None:
        raise Fp8FormatError(f"{config_file}: quantization_config {quant!r} names neither "
                             "quant_method nor quant_algo / quant_type")
    # diffusers spells weight and activation types "FP8" or "FP8_FP8"
    parts = str(algo).upper().split("_") if algo is not None else []
    if algo is not None and (parts[0] not in KNOWN_ALGOS or len(parts) > 2
                             or (len(parts) == 2 and parts[1] not in KNOWN_ALGOS)):
        raise Fp8FormatError(f"{config_file}: quantization_config algorithm {algo!r} is not one "
                             "worldserve loads (ModelOpt FP8 per-tensor only)")


def _layout(weights_dir: Path, names: set[str]) -> Layout:
    if any(n.endswith((f".{NATIVE_SCALE}", f".{NATIVE_INPUT_AMAX}")) for n in names):
        return "modelopt_native"
    if any(n.endswith(f".{EXPORTED_SCALE}") for n in names):
        return "modelopt_exported"
    raise Fp8FormatError(f"{weights_dir}: FP8 tensors but no scales ({EXPORTED_SCALE} or "
                         f"{NATIVE_SCALE}) in the safetensors files: the weights cannot be "
                         "dequantised, and loading them unscaled would be silently wrong")


def _evidence(quant: Any, state_file: Path | None, num_fp8: int) -> str:
    parts = [f"{num_fp8} FP8 E4M3 tensors"]
    if isinstance(quant, dict):
        parts.append("quantization_config " + json.dumps(
            {k: quant[k] for k in ("quant_method", "quant_algo", "quant_type") if k in quant}))
    if state_file is not None:
        parts.append(f"{state_file.parent.name}/{state_file.name}")
    return ", ".join(parts)


def _state_candidates(weights_dir: Path, root: Path | None) -> list[Path]:
    candidates = [weights_dir / MODELOPT_STATE]
    if root is not None and Path(root) != weights_dir:
        candidates.append(Path(root) / MODELOPT_STATE)
    return candidates


def weight_files(weights_dir: Path) -> list[Path]:
    """The safetensors shards of a folder (sorted): those its index names, if it has one."""
    folder = Path(weights_dir)
    for index in sorted(folder.glob("*.safetensors.index.json")):
        weight_map = (read_json(index) or {}).get("weight_map")
        if isinstance(weight_map, dict) and weight_map:
            return sorted(folder / name for name in set(weight_map.values()))
    return sorted(folder.glob("*.safetensors"))


def _headers(weights_dir: Path) -> dict[Path, dict[str, dict[str, Any]]]:
    return {path: read_header(path) for path in weight_files(weights_dir)}


def _fp8_tensors(headers: dict[Path, dict[str, dict[str, Any]]]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for header in headers.values():
        for name, entry in header.items():
            if entry.get("dtype") in FP8_DTYPES:
                found.setdefault(entry["dtype"], []).append(name)
    return found


def read_header(path: Path) -> dict[str, dict[str, Any]]:
    """Tensor name -> {dtype, shape, data_offsets} from a safetensors header (header only)."""
    header = read_safetensors_header(path)
    return {k: v for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)}
