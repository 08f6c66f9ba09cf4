"""`Fp8Linear`: W8A8 per-tensor static FP8 (ModelOpt's scheme) for models transformers cannot
quantise (the Cosmos3 reasoner).

The weight stays FP8 E4M3; each call quantises the input with its static scale
(`clamp(x / input_scale, ±448)` to E4M3) and multiplies with `torch._scaled_mm`, which computes
`(x_fp8 * input_scale) @ (w_fp8 * weight_scale).T` with FP32 accumulation. torch 2.13 runs
`_scaled_mm` on the CPU too, so the CPU tests check this very call against
`scaled_mm_reference` and against W8A16; the CUDA kernel (sm89+) is unverified here. A
checkpoint without input scales gets one scale per row (token) from the row itself.
"""

from __future__ import annotations

import torch
from torch import nn

from worldserve.levers.fp8.weights import FP8_MAX, QuantLinear


def quantise_input(x: torch.Tensor, input_scale: torch.Tensor) -> torch.Tensor:
    """`x` (M, K) in FP8 E4M3 at a per-tensor or (M, 1) per-row scale (saturating, like
    ModelOpt)."""
    return (x.float() / input_scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def scaled_mm_reference(a: torch.Tensor, b_t: torch.Tensor, scale_a: torch.Tensor,
                        scale_b: torch.Tensor, bias: torch.Tensor | None,
                        out_dtype: torch.dtype) -> torch.Tensor:
    """`torch._scaled_mm(a, b_t, scale_a, scale_b, bias, out_dtype)` in float32 (any device)."""
    out = (a.float() * scale_a) @ (b_t.float() * scale_b)  # (M, N), fp32 accumulation
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


class Fp8Linear(nn.Module):
    """A linear layer with an FP8 E4M3 weight (out, in) and per-tensor static scales."""

    def __init__(self, linear: QuantLinear, bias: torch.Tensor | None, out_dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        if linear.weight_scale.numel() != 1:
            raise ValueError("Fp8Linear takes per-tensor weight scales; per-channel scales load "
                             "W8A16 (fp8_compute: w8a16)")
        self.out_features, self.in_features = linear.weight.shape
        self.register_buffer("weight", linear.weight.to(device))
        self.register_buffer("weight_scale", linear.weight_scale.float().reshape(()).to(device))
        input_scale = linear.input_scale
        self.static_input = input_scale is not None
        self.register_buffer("input_scale", (input_scale if input_scale is not None
                                             else torch.ones(())).float().reshape(()).to(device))
        self.bias = None if bias is None else nn.Parameter(bias.to(device, out_dtype),
                                                           requires_grad=False)
        self.out_dtype = out_dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)  # (M, K)
        if self.static_input:
            scale_a, scale_b = self.input_scale, self.weight_scale
        else:  # row-wise scales: (M, 1) for the input, the weight's scale spread to (1, N)
            scale_a = _dynamic_row_scales(x2)
            scale_b = self.weight_scale.expand(1, self.out_features).contiguous()
        x_fp8 = quantise_input(x2, scale_a)
        w_t = self.weight.t()  # (K, N), column-major as _scaled_mm wants
        out = torch._scaled_mm(x_fp8, w_t, scale_a=scale_a, scale_b=scale_b,
                               bias=self.bias, out_dtype=self.out_dtype)
        return out.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"static_input={self.static_input}")


def _dynamic_row_scales(x: torch.Tensor) -> torch.Tensor:
    """(M, 1) input scales, one per row (token), for checkpoints without input scales: a row's
    rounding then depends on that row alone, so a session decodes the same beside any others
    (one scale over the batch made each reply depend on its batch-mates' activations). vLLM's
    dynamic per-token FP8; the CUDA kernel's row-wise path is unverified here."""
    return (x.detach().abs().amax(dim=1, keepdim=True).float() / FP8_MAX).clamp(min=1e-12)


def scaled_mm_fits(linear: QuantLinear) -> bool:
    """`torch._scaled_mm` takes both weight dims in multiples of 16 and per-tensor scales."""
    out_features, in_features = linear.weight.shape
    return out_features % 16 == 0 and in_features % 16 == 0 and linear.weight_scale.numel() == 1


def swap_in_fp8_linears(model: nn.Module, linears: dict[str, QuantLinear],
                        out_dtype: torch.dtype, device: torch.device | str) -> int:
    """Replace each `nn.Linear` named in `linears` (prefix "a.b." -> module "a.b") by an
    `Fp8Linear` holding the checkpoint's FP8 weight; returns how many were replaced."""
    for prefix, linear in linears.items():
        name = prefix.rstrip(".")
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        old = getattr(parent, leaf)
        if not isinstance(old, nn.Linear):
            raise TypeError(f"{name} is a {type(old).__name__}, not a Linear")
        bias = None if old.bias is None else old.bias.detach()
        setattr(parent, leaf, Fp8Linear(linear, bias, out_dtype, device))
    return len(linears)
