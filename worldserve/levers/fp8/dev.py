"""Tiny ModelOpt FP8 checkpoints from plain ones, for the tests and benchmarks/fp8.py.

- `quantise_exported`: the exported layout, written by hand (per-tensor E4M3 weight,
  `weight_scale`, `input_scale`, `quantization_config {quant_method: modelopt, quant_algo: FP8}`);
- `quantise_native_by_hand`: the native tensor names (`weight_quantizer._scale`,
  `input_quantizer._amax`) written by hand, used for the reasoner (ModelOpt quantises a loaded
  transformers model under the model's names, not the checkpoint's);
- `quantise_generator_native`: ModelOpt's own `mtq.quantize` + `mtq.compress` on the Cosmos3
  generator transformer, its state dict and `modelopt_state.pth` (needs `worldserve[fp8]`);
- `write_dequantised`: the reference, every FP8 weight dequantised (`fp8.float() * scale`) into
  a plain checkpoint of the same layout: what W8A16 must equal.

Each rewrites the safetensors shards of one folder in place (the index's weight map follows).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

from worldserve.levers.fp8.detect import (
    EXPORTED_INPUT_SCALE,
    EXPORTED_SCALE,
    MODELOPT_STATE,
    NATIVE_INPUT_AMAX,
    NATIVE_SCALE,
    weight_files,
)
from worldserve.levers.fp8.weights import FP8_MAX

EXPORTED_CONFIG = {"quant_method": "modelopt", "quant_algo": "FP8"}
DEV_INPUT_AMAX = 8.0  # static input amax of the hand-written layouts (no calibration run)

Rewrite = Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]


def is_quantisable(name: str, tensor: torch.Tensor) -> bool:
    """Linear weights ModelOpt's FP8 recipe quantises here: 2-D `*.weight`, not embeddings
    or the LM head."""
    return (name.endswith(".weight") and tensor.dim() == 2 and tensor.is_floating_point()
            and "embed" not in name and "lm_head" not in name)


def quantise_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(FP8 E4M3 weight, float32 per-tensor scale): scale = amax / 448, like ModelOpt."""
    scale = (weight.detach().abs().amax().float() / FP8_MAX).clamp(min=1e-12)
    return (weight.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def quantise_exported(folder: Path, config_file: Path, *, native_names: bool = False,
                      quant_config: dict | None = None) -> int:
    """Quantise every quantisable weight in `folder`'s shards; returns how many. Exported
    names and `quant_config` (default `EXPORTED_CONFIG`) in `config_file`, or with
    `native_names` ModelOpt's buffer names and no config entry."""
    count = 0

    def rewrite(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        nonlocal count
        out: dict[str, torch.Tensor] = {}
        for name, tensor in tensors.items():
            if not is_quantisable(name, tensor):
                out[name] = tensor
                continue
            prefix = name.removesuffix("weight")
            out[name], scale = quantise_weight(tensor)
            if native_names:
                out[prefix + NATIVE_SCALE] = scale
                out[prefix + NATIVE_INPUT_AMAX] = torch.tensor(DEV_INPUT_AMAX)
            else:
                out[prefix + EXPORTED_SCALE] = scale
                out[prefix + EXPORTED_INPUT_SCALE] = torch.tensor(DEV_INPUT_AMAX / FP8_MAX)
            count += 1
        return out

    rewrite_shards(folder, rewrite)
    if not native_names:
        set_quant_config(config_file, quant_config or EXPORTED_CONFIG)
    return count


def quantise_native_by_hand(folder: Path, state_file: Path | None = None) -> int:
    """The native tensor names by hand; `state_file` (if given) gets a stand-in
    modelopt_state.pth (W8A16 reads the tensors only; ModelOpt's restore would need its own)."""
    count = quantise_exported(folder, folder / "config.json", native_names=True)
    if state_file is not None:
        torch.save({"modelopt_state_dict": [], "modelopt_version": "dev"}, state_file)
    return count


def quantise_generator_native(model_dir: Path, *, root_state: bool = False,
                              diffusers_config: bool = False) -> int:
    """ModelOpt's own FP8 (`mtq.quantize` with a calibration pass over each linear, then
    `mtq.compress`) on `model_dir/transformer`; writes its state dict and
    `transformer/modelopt_state.pth` (and the root copy the published fp8 revision has).
    `diffusers_config`: also the `quantization_config` diffusers' ModelOpt quantizer reads
    (`quant_type` and the `modelopt_config` ModelOpt >= 0.44 needs there), for W8A8 restore."""
    import modelopt.torch.opt as mto
    import modelopt.torch.quantization as mtq
    from diffusers import Cosmos3OmniTransformer

    folder = Path(model_dir) / "transformer"
    model = Cosmos3OmniTransformer.from_pretrained(folder, local_files_only=True).eval()
    config = fp8_config(model)
    mtq.quantize(model, config, forward_loop=_calibrate_linears)
    mtq.compress(model)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    rewrite_shards(folder, lambda tensors: {k: state[k] for k in _shard_keys(tensors, state)})
    modelopt_state = mto.modelopt_state(model)
    torch.save(modelopt_state, folder / MODELOPT_STATE)
    if root_state:
        torch.save(modelopt_state, Path(model_dir) / MODELOPT_STATE)
    if diffusers_config:
        set_quant_config(folder / "config.json", {
            "quant_method": "modelopt", "quant_type": "FP8",
            "modelopt_config": json.loads(json.dumps(config, default=str))})
    return sum(v.dtype == torch.float8_e4m3fn for v in state.values())


def fp8_config(model: torch.nn.Module) -> dict:
    """ModelOpt's FP8 recipe, less the modules the model keeps in float32: diffusers 0.42 upcasts
    their weights before ModelOpt's restore sees them, which then fails (docs/generation.md)."""
    import copy

    import modelopt.torch.quantization as mtq

    config = copy.deepcopy(mtq.FP8_DEFAULT_CFG)
    for name in getattr(model, "_keep_in_fp32_modules", None) or ():
        config["quant_cfg"].append({"quantizer_name": f"*{name}*", "enable": False})
    return config


def _calibrate_linears(model: torch.nn.Module) -> None:
    """ModelOpt's calibration loop: one seeded random batch through every quantised linear."""
    generator = torch.Generator().manual_seed(0)
    for module in model.modules():
        if type(module).__name__ == "QuantLinear":
            module(torch.randn(4, module.in_features, generator=generator))


def _shard_keys(tensors: dict[str, torch.Tensor], state: dict[str, torch.Tensor]) -> list[str]:
    """A shard's keys after ModelOpt: its own plus the quantizer buffers of its linears."""
    keys = [k for k in tensors if k in state]
    prefixes = {k.removesuffix("weight") for k in keys if k.endswith(".weight")}
    extra = [k for k in state if "_quantizer." in k and k.rsplit("_quantizer.", 1)[0]
             .rpartition(".")[0] + "." in prefixes]
    return keys + extra


def write_dequantised(folder: Path, config_file: Path) -> int:
    """Rewrite a quantised folder as plain float32 weights (the W8A16 reference); drops the
    `quantization_config` and the folder's modelopt_state.pth. Returns the count.

    Written apart from the loader's code path (`weights.dequantise`) on purpose: a reference
    built by the code under test would agree with it however wrong it were."""
    count = 0

    def rewrite(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        nonlocal count
        out: dict[str, torch.Tensor] = {}
        for name, tensor in tensors.items():
            if "_quantizer." in name or name.endswith((f".{EXPORTED_SCALE}",
                                                       f".{EXPORTED_INPUT_SCALE}")):
                continue
            if tensor.dtype == torch.float8_e4m3fn:
                prefix = name.removesuffix("weight")
                scale = tensors.get(prefix + EXPORTED_SCALE, tensors.get(prefix + NATIVE_SCALE))
                tensor = tensor.to(torch.float32) * scale.to(torch.float32)
                count += 1
            out[name] = tensor
        return out

    rewrite_shards(folder, rewrite)
    set_quant_config(config_file, None)
    (folder / MODELOPT_STATE).unlink(missing_ok=True)
    return count


def rewrite_shards(folder: Path, rewrite: Rewrite) -> None:
    """Apply `rewrite` to each safetensors shard of `folder`, keeping the index in step."""
    from safetensors.torch import load_file, save_file

    weight_map: dict[str, str] = {}
    for path in weight_files(folder):
        tensors = rewrite(load_file(path))
        save_file({k: v.contiguous() for k, v in tensors.items()}, path)
        weight_map.update({k: path.name for k in tensors})
    for index in folder.glob("*.safetensors.index.json"):
        data = json.loads(index.read_text())
        data["weight_map"] = weight_map
        index.write_text(json.dumps(data, indent=2))


def set_quant_config(config_file: Path, quant_config: dict | None) -> None:
    """Set (or with None remove) `quantization_config` in a config.json."""
    config = json.loads(Path(config_file).read_text())
    if quant_config is None:
        config.pop("quantization_config", None)
    else:
        config["quantization_config"] = quant_config
    Path(config_file).write_text(json.dumps(config, indent=2))
