"""Read a ModelOpt FP8 folder's tensors: the plain ones, and per quantised linear its FP8
weight with its scales; W8A16 dequantises each weight once (`fp8.to(float32) * scale`).

A quantised linear whose weight scale is missing, or a quantizer buffer this module does not
know (a pre-quant scale would change the maths), is a `Fp8FormatError`: never dropped.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from worldserve.levers.fp8.detect import (
    EXPORTED_INPUT_SCALE,
    EXPORTED_SCALE,
    NATIVE_INPUT_AMAX,
    NATIVE_SCALE,
    Fp8FormatError,
    QuantFormat,
    weight_files,
)

FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max: input_scale = input amax / 448
# Quantizer buffers that W8A16 may leave behind: amaxes of quantizers whose scale is either read
# here (weight, input) or only matters for W8A8 activations (output / bmm quantizers).
IGNORED_QUANTIZER_BUFFERS = ("._amax",)


@dataclass
class QuantLinear:
    """One quantised linear's tensors: FP8 weight (out, in), its scale, its static input scale."""

    weight: torch.Tensor
    weight_scale: torch.Tensor
    input_scale: torch.Tensor | None = None


@dataclass
class Fp8Tensors:
    """A folder's tensors split into plain ones and quantised linears (by module prefix)."""

    plain: dict[str, torch.Tensor] = field(default_factory=dict)
    linears: dict[str, QuantLinear] = field(default_factory=dict)


def read_fp8_tensors(fmt: QuantFormat) -> Fp8Tensors:
    """Every tensor of `fmt.weights_dir`, quantised linears grouped with their scales."""
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for path in weight_files(fmt.weights_dir):
        tensors.update(load_file(path))
    return split_tensors(tensors, str(fmt.weights_dir))


def split_tensors(tensors: dict[str, torch.Tensor], where: str) -> Fp8Tensors:
    """Group `tensors` (one checkpoint's state dict) into plain tensors and quantised linears."""
    out = Fp8Tensors()
    for name, tensor in tensors.items():
        if name.endswith(".weight") and tensor.dtype == torch.float8_e4m3fn:
            prefix = name.removesuffix("weight")
            out.linears[prefix] = QuantLinear(tensor, _weight_scale(tensors, prefix, where),
                                              _input_scale(tensors, prefix))
    consumed = {p + s for p in out.linears for s in ("weight", EXPORTED_SCALE,
                                                     EXPORTED_INPUT_SCALE, NATIVE_SCALE,
                                                     NATIVE_INPUT_AMAX)}
    for name, tensor in tensors.items():
        if name in consumed or _ignorable_quantizer_buffer(name, where):
            continue
        if tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            raise Fp8FormatError(f"{where}: FP8 tensor {name} is not a linear weight; "
                                 "worldserve dequantises FP8 linear weights only")
        if name.endswith((f".{EXPORTED_SCALE}", f".{EXPORTED_INPUT_SCALE}")):
            continue  # the scale of a linear stored unquantised (the exporter skipped it)
        out.plain[name] = tensor
    return out


def _weight_scale(tensors: dict[str, torch.Tensor], prefix: str, where: str) -> torch.Tensor:
    for suffix in (EXPORTED_SCALE, NATIVE_SCALE):
        scale = tensors.get(prefix + suffix)
        if scale is not None:
            return scale
    raise Fp8FormatError(f"{where}: quantised linear {prefix}weight is FP8 E4M3 but its scale "
                         f"({prefix}{EXPORTED_SCALE} or {prefix}{NATIVE_SCALE}) is missing; "
                         "the checkpoint is incomplete and would load silently wrong")


def _input_scale(tensors: dict[str, torch.Tensor], prefix: str) -> torch.Tensor | None:
    scale = tensors.get(prefix + EXPORTED_INPUT_SCALE)
    if scale is not None:
        return scale.float()
    amax = tensors.get(prefix + NATIVE_INPUT_AMAX)
    return None if amax is None else amax.float() / FP8_MAX


def _ignorable_quantizer_buffer(name: str, where: str) -> bool:
    if "_quantizer." not in name:
        return False
    if name.endswith(IGNORED_QUANTIZER_BUFFERS):
        return True
    raise Fp8FormatError(f"{where}: quantizer buffer {name} is not one worldserve understands "
                         "(it reads weight_quantizer._scale and input_quantizer._amax)")


def dequantise(linear: QuantLinear, dtype: torch.dtype,
               device: torch.device | str = "cpu") -> torch.Tensor:
    """W8A16: the weight in `dtype`, `fp8.to(float32) * scale` (per tensor or per out channel)."""
    weight = linear.weight.to(device).to(torch.float32)
    scale = linear.weight_scale.to(device).to(torch.float32)
    if scale.numel() > 1:
        scale = scale.reshape(-1, *([1] * (weight.dim() - 1)))  # (out, 1): per output channel
    return (weight * scale).to(dtype)


def dequantised_state_dict(tensors: Fp8Tensors, dtype: torch.dtype,
                           device: torch.device | str = "cpu",
                           keep_fp32: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """(name, tensor) of the plain state dict W8A16 loads: floating tensors in `dtype` (float32
    under a module named in `keep_fp32`, like diffusers' `_keep_in_fp32_modules`), quantised
    weights dequantised."""
    def target(name: str) -> torch.dtype:
        return torch.float32 if set(name.split(".")) & set(keep_fp32) else dtype

    for name, tensor in tensors.plain.items():
        yield name, (tensor.to(device, target(name)) if tensor.is_floating_point()
                     else tensor.to(device))
    for prefix, linear in tensors.linears.items():
        yield prefix + "weight", dequantise(linear, target(prefix + "weight"), device)
