"""Load ModelOpt FP8 checkpoints for the Cosmos3 stages: choose W8A8 or W8A16, and build the
generator transformer or the reasoner model from the FP8 files.

- W8A16 (CPU, GPUs below compute capability 8.9, or `fp8_compute: w8a16`): every FP8 weight is
  dequantised once at load into the stage dtype; the model is then an ordinary one.
- W8A8 on CUDA sm89+, **unverified here**: the reasoner (`auto` or `fp8_compute: w8a8`) gets
  `Fp8Linear`s (`torch._scaled_mm`) in place of its quantised linears; the generator only with
  `fp8_compute: w8a8`, through ModelOpt's own restore (`enable_huggingface_checkpointing`
  before diffusers' `from_pretrained`, then the runner applies the Cosmos3 mixed-precision step
  schedule). `auto` keeps the generator W8A16: that restore failed on the CPU here with
  ModelOpt 0.47 (docs/generation.md, FP8), and an unverified default must not stop startup.

Either way the log says which, and how many quantised linears got their scale.
"""

from __future__ import annotations

import logging
import types
from pathlib import Path
from typing import Any, Literal

import torch

from worldserve.levers.fp8.detect import MODELOPT_STATE, Fp8FormatError, QuantFormat, detect
from worldserve.levers.fp8.linear import scaled_mm_fits, swap_in_fp8_linears
from worldserve.levers.fp8.weights import Fp8Tensors, dequantised_state_dict, read_fp8_tensors
from worldserve.models.common import resolve_dtype

logger = logging.getLogger("worldserve.fp8")

Fp8Compute = Literal["auto", "w8a16", "w8a8"]
MIN_W8A8_CAPABILITY = (8, 9)  # Ada / Hopper: FP8 tensor cores, torch._scaled_mm


def generator_format(model_dir: Path) -> QuantFormat | None:
    """The Cosmos3 generator transformer's format (`transformer/`, root modelopt_state.pth)."""
    folder = Path(model_dir) / "transformer"
    return detect(folder, folder / "config.json", root=Path(model_dir))


def reasoner_format(model_dir: Path) -> QuantFormat | None:
    """The Cosmos3 reasoner's format (root `config.json` and safetensors)."""
    return detect(Path(model_dir), Path(model_dir) / "config.json")


def choose_compute(requested: str, device: str, *, fmt: QuantFormat,
                   generator: bool) -> tuple[str, str]:
    """("w8a8" | "w8a16", why). An explicit `w8a8` that cannot run is an error."""
    if requested not in ("auto", "w8a16", "w8a8"):
        raise ValueError(f"fp8_compute must be auto, w8a16 or w8a8; got {requested!r}")
    if requested == "w8a16":
        return "w8a16", "fp8_compute is w8a16"
    missing = _w8a8_missing(device, fmt, generator)
    if missing is None and (requested == "w8a8" or not generator):
        return "w8a8", f"{device} supports FP8 matmuls"
    if requested == "w8a8":
        raise Fp8FormatError(f"fp8_compute is w8a8 but {missing}; use fp8_compute auto or w8a16")
    if missing is None:  # the generator's restore failed on the CPU here: only when asked for
        return "w8a16", ("the generator's W8A8 (ModelOpt restore) is unverified: set "
                         "fp8_compute: w8a8 to use it")
    return "w8a16", missing


def _w8a8_missing(device: str, fmt: QuantFormat, generator: bool) -> str | None:
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        return f"device {device!r} is not a CUDA GPU"
    capability = torch.cuda.get_device_capability(torch.device(device))
    if capability < MIN_W8A8_CAPABILITY:
        return f"{device} has compute capability {capability}, FP8 matmuls need >= 8.9"
    return _generator_restore_missing(fmt) if generator else None


def _generator_restore_missing(fmt: QuantFormat) -> str | None:
    """What diffusers 0.42 + ModelOpt's restore need (notes/gpu-readiness.md §1, verified on
    CPU there): the native layout with transformer/modelopt_state.pth, a quantization_config
    with diffusers' `quant_type`, and with ModelOpt >= 0.44 a stored `modelopt_config`."""
    if fmt.layout != "modelopt_native" or fmt.state_file != fmt.weights_dir / MODELOPT_STATE:
        return ("the generator's W8A8 path is ModelOpt's restore, which needs the native layout "
                "with transformer/modelopt_state.pth")
    quant = fmt.quant_config or {}
    if "quant_type" not in quant:
        return ("diffusers' ModelOpt quantizer needs quantization_config.quant_type in "
                "transformer/config.json")
    try:
        import modelopt
    except ImportError:
        return "nvidia-modelopt is not installed (pip install 'worldserve[fp8]')"
    from packaging.version import Version

    if Version(modelopt.__version__) >= Version("0.44") and "modelopt_config" not in quant:
        return (f"nvidia-modelopt {modelopt.__version__} with diffusers needs a stored "
                "quantization_config.modelopt_config (else a TypeError at load)")
    return None


def load_generator_transformer(model_dir: Path, dtype: Any, device: str,
                               fp8_compute: str = "auto") -> Any | None:
    """The generator transformer built from FP8 files for W8A16; None for a plain checkpoint
    or for W8A8, where diffusers loads it after ModelOpt's restore hook is enabled."""
    fmt = generator_format(model_dir)
    if fmt is None:
        return None
    mode, why = choose_compute(fp8_compute, device, fmt=fmt, generator=True)
    if mode == "w8a8":
        import modelopt.torch.opt as mto

        mto.enable_huggingface_checkpointing()  # from_pretrained restores modelopt_state.pth
        logger.info("generator: %s loads W8A8 through ModelOpt's restore (%s; unverified "
                    "path)", fmt.describe(), why)
        return None
    from accelerate import init_empty_weights
    from diffusers import Cosmos3OmniTransformer

    config = dict(Cosmos3OmniTransformer.load_config(fmt.weights_dir))
    config.pop("quantization_config", None)
    with init_empty_weights():
        model = Cosmos3OmniTransformer.from_config(config)
    count = _load_w8a16(model, read_fp8_tensors(fmt), resolve_dtype(dtype), device)
    _log_w8a16("generator", fmt, count, dtype, why)
    return model.eval()


def load_reasoner_model(model_dir: Path, dtype: Any, device: str,
                        fp8_compute: str = "auto") -> Any | None:
    """The reasoner model built from FP8 files (W8A16, or W8A8 with `Fp8Linear`s); None for a
    plain checkpoint (transformers loads it as usual).

    transformers renames checkpoint keys on load (`layers.0.self_attn.to_q` ->
    `model.language_model.layers.0.self_attn.q_proj`), so the dequantised tensors go through
    its own `from_pretrained(state_dict=...)`, under the checkpoint's names.
    """
    fmt = reasoner_format(model_dir)
    if fmt is None:
        return None
    from transformers import AutoConfig, AutoModelForImageTextToText

    mode, why = choose_compute(fp8_compute, device, fmt=fmt, generator=False)
    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # transformers would "skip" it and upcast: we load here
    torch_dtype = resolve_dtype(dtype)
    tensors = read_fp8_tensors(fmt)
    model_class = AutoModelForImageTextToText._model_mapping[type(config)]
    keep_fp32 = tuple(getattr(model_class, "_keep_in_fp32_modules", None) or ())
    state = dict(dequantised_state_dict(tensors, torch_dtype, keep_fp32=keep_fp32))
    model = _unpatched_from_pretrained(model_class)(None, config=config, state_dict=state,
                                                    dtype=torch_dtype, device_map=str(device))
    if mode == "w8a8":
        linears = {target: tensors.linears[source]
                   for source, target in match_linears(model, state, tensors).items()}
        fp8_ready = {k: v for k, v in linears.items() if scaled_mm_fits(v)}
        count = swap_in_fp8_linears(model, fp8_ready, torch_dtype, device)
        logger.info("reasoner: %s loaded W8A8 (Fp8Linear, torch._scaled_mm; %s): %d quantised "
                    "linears with their scales, %d of them W8A16 (shapes _scaled_mm refuses)",
                    fmt.describe(), why, len(linears), len(linears) - count)
    else:
        _log_w8a16("reasoner", fmt, len(tensors.linears), dtype, why)
    return model.eval()


def _unpatched_from_pretrained(model_class: Any) -> Any:
    """`model_class.from_pretrained` as transformers defines it. A W8A8 generator in the same
    process enables ModelOpt's restore (`enable_huggingface_checkpointing`), which replaces
    `from_pretrained` process-wide and calls `os.path.isdir(None)` on a load from a state dict;
    ModelOpt keeps the original in the class's `_modelopt_cache`."""
    for klass in model_class.__mro__:
        original = vars(klass).get("_modelopt_cache", {}).get("from_pretrained")
        if original is not None:
            return types.MethodType(original.__func__, model_class)
    return model_class.from_pretrained


def match_linears(model: Any, state: dict[str, torch.Tensor],
                  tensors: Fp8Tensors) -> dict[str, str]:
    """Checkpoint prefix -> the model's module prefix of each quantised linear, by name:
    transformers' own renaming of the checkpoint key (`layers.0.self_attn.to_q.weight` ->
    `model.language_model.layers.0.self_attn.q_proj.weight`). The named module must be a Linear
    holding exactly that weight (one compare per linear, on the module's device), else W8A8
    cannot be set up safely. Comparing every same-shape linear instead copied about 0.8 TB
    device to host for Nano (notes/gpu-first-contact.md §5)."""
    rename = _checkpoint_renamer(model)
    modules = dict(model.named_modules())
    matches: dict[str, str] = {}
    for prefix in tensors.linears:
        key = prefix + "weight"
        name = rename(key).removesuffix(".weight")
        module = modules.get(name)
        weight = state[key]
        if not isinstance(module, torch.nn.Linear) or module.weight.shape != weight.shape \
                or not torch.equal(module.weight, weight.to(module.weight.device)):
            raise Fp8FormatError(f"W8A8: checkpoint linear {key} loads as {name!r}, which is "
                                 "not a Linear holding that weight; use fp8_compute: w8a16")
        matches[prefix] = name + "."
    return matches


def _checkpoint_renamer(model: Any) -> Any:
    """Checkpoint key -> the model's parameter name, as transformers' loader renames it."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import (
            WeightConverter,
            WeightRenaming,
            rename_source_key,
        )
    except ImportError as exc:  # the loader's renaming API moved: refuse rather than guess
        raise Fp8FormatError(f"W8A8: transformers' key renaming is not importable ({exc}); "
                             "use fp8_compute: w8a16") from exc
    mapping = get_model_conversion_mapping(model)
    renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
    converters = [m for m in mapping if isinstance(m, WeightConverter)]
    params = dict(model.named_parameters())

    def rename(key: str) -> str:
        renamed, _ = rename_source_key(key, renamings, converters, model.base_model_prefix,
                                       params)
        return renamed if renamed in params or key not in params else key

    return rename


def _load_w8a16(model: Any, tensors: Fp8Tensors, dtype: torch.dtype, device: str) -> int:
    """Load the dequantised state dict into `model` (built on the meta device); returns how
    many quantised linears were dequantised with their scale."""
    keep_fp32 = tuple(getattr(model, "_keep_in_fp32_modules", None) or ())
    state = dict(dequantised_state_dict(tensors, dtype, device, keep_fp32))
    result = model.load_state_dict(state, strict=False, assign=True)
    if result.unexpected_keys or result.missing_keys:
        raise Fp8FormatError(f"the FP8 checkpoint does not match the model: missing "
                             f"{result.missing_keys[:5]}, unexpected {result.unexpected_keys[:5]}")
    model.to(device)
    return len(tensors.linears)


def _log_w8a16(stage: str, fmt: QuantFormat, count: int, dtype: Any, why: str) -> None:
    if count != fmt.num_fp8_weights:
        raise Fp8FormatError(f"{fmt.weights_dir}: {fmt.num_fp8_weights} FP8 weights in the "
                             f"headers but {count} dequantised")
    logger.info("%s: %s loaded W8A16: %d quantised linears dequantised once with their scales "
                "into %s (%s)", stage, fmt.describe(), count,
                str(resolve_dtype(dtype)).removeprefix("torch."), why)
