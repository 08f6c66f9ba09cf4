"""W8A16 dequantisation, the W8A8 `Fp8Linear` (the real `torch._scaled_mm`, which torch runs on
the CPU too) against its float reference and against W8A16, and how the compute is chosen."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from worldserve.levers.fp8 import load
from worldserve.levers.fp8.detect import QuantFormat
from worldserve.levers.fp8.dev import quantise_weight
from worldserve.levers.fp8.linear import (
    Fp8Linear,
    quantise_input,
    scaled_mm_reference,
    swap_in_fp8_linears,
)
from worldserve.levers.fp8.weights import (
    FP8_MAX,
    Fp8FormatError,
    QuantLinear,
    dequantise,
    split_tensors,
)


def seeded(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def quant_linear(out_features: int = 48, in_features: int = 32, input_amax: float = 4.0):
    weight = seeded(out_features, in_features) * 0.1
    fp8, scale = quantise_weight(weight)
    return weight, QuantLinear(fp8, scale, torch.tensor(input_amax / FP8_MAX))


def test_dequantise_is_fp8_times_scale_and_close_to_the_original():
    weight, linear = quant_linear()
    deq = dequantise(linear, torch.float32)
    assert torch.equal(deq, linear.weight.float() * linear.weight_scale)
    assert (deq - weight).abs().max() <= weight.abs().max() / 16  # E4M3: 3 mantissa bits
    assert dequantise(linear, torch.bfloat16).dtype == torch.bfloat16


def test_per_channel_scales_scale_each_output_row():
    fp8 = seeded(4, 8).to(torch.float8_e4m3fn)
    scale = torch.tensor([1.0, 2.0, 3.0, 4.0])
    deq = dequantise(QuantLinear(fp8, scale), torch.float32)
    assert torch.equal(deq, fp8.float() * scale[:, None])


def test_a_quantised_linear_without_its_scale_is_refused():
    fp8, scale = quantise_weight(seeded(4, 4))
    tensors = {"a.weight": fp8, "a.weight_scale": scale, "b.weight": fp8.clone()}
    with pytest.raises(Fp8FormatError, match="b.weight is FP8 E4M3 but its scale"):
        split_tensors(tensors, "ckpt")


def test_split_groups_both_layouts_and_refuses_unknown_quantizer_buffers():
    fp8, scale = quantise_weight(seeded(4, 4))
    native = {"a.weight": fp8, "a.weight_quantizer._scale": scale,
              "a.weight_quantizer._amax": scale * FP8_MAX,
              "a.input_quantizer._amax": torch.tensor(4.48), "norm.weight": torch.ones(4)}
    split = split_tensors(native, "ckpt")
    assert set(split.plain) == {"norm.weight"} and set(split.linears) == {"a."}
    assert torch.allclose(split.linears["a."].input_scale, torch.tensor(0.01))
    native["a.input_quantizer._pre_quant_scale"] = torch.ones(4)
    with pytest.raises(Fp8FormatError, match="_pre_quant_scale is not one"):
        split_tensors(native, "ckpt")


def test_fp8_linear_runs_scaled_mm_equal_to_its_float_reference():
    _, linear = quant_linear()
    bias = seeded(48, seed=1)
    layer = Fp8Linear(linear, bias, torch.float32, "cpu")
    x = seeded(2, 5, 32, seed=2)  # (B, T, K)
    out = layer(x)
    assert out.shape == (2, 5, 48)
    x_fp8 = quantise_input(x.reshape(-1, 32), layer.input_scale)
    reference = scaled_mm_reference(x_fp8, linear.weight.t(), layer.input_scale,
                                    layer.weight_scale, bias, torch.float32)
    torch.testing.assert_close(out.reshape(-1, 48), reference, rtol=1e-5, atol=1e-5)


def test_w8a8_equals_w8a16_on_the_quantised_input():
    """The only difference W8A8 makes is the input's FP8 rounding: on inputs that are already
    FP8 values at the input scale, W8A8 == the W8A16 linear (dequantised weight)."""
    _, linear = quant_linear()
    layer = Fp8Linear(linear, None, torch.float32, "cpu")
    x = seeded(7, 32, seed=3)
    x_on_grid = quantise_input(x, layer.input_scale).float() * layer.input_scale
    w8a16 = x_on_grid @ dequantise(linear, torch.float32).t()
    torch.testing.assert_close(layer(x_on_grid), w8a16, rtol=1e-5, atol=1e-5)
    error = (layer(x) - x @ dequantise(linear, torch.float32).t()).abs().max()
    assert 0 < error < 0.1 * w8a16.abs().max()  # activation rounding: present, small


def test_fp8_linear_without_an_input_scale_quantises_each_row_alone():
    """Dynamic scales are per row (token): a row's output is the same whatever rows share its
    batch, even a row 1,000 times larger (one scale over the batch rounded the small row to
    zero), and close to W8A16."""
    _, linear = quant_linear()
    linear.input_scale = None
    layer = Fp8Linear(linear, None, torch.float32, "cpu")
    small, large = seeded(1, 32, seed=4) * 0.01, seeded(4, 32, seed=5) * 10
    alone = layer(small)
    batched = layer(torch.cat([large[:2], small, large[2:]]))
    torch.testing.assert_close(batched[2:3], alone, rtol=1e-5, atol=1e-8)  # GEMM blocking only
    w8a16 = small @ dequantise(linear, torch.float32).t()
    assert (alone - w8a16).abs().max() < 0.1 * w8a16.abs().max()
    x = seeded(3, 32, seed=6) * 100  # far beyond any static scale: no clamping here
    w8a16 = x @ dequantise(linear, torch.float32).t()
    assert (layer(x) - w8a16).abs().max() < 0.1 * w8a16.abs().max()


def test_swap_in_fp8_linears_replaces_the_named_linears_only():
    model = nn.Sequential(nn.Linear(32, 48), nn.ReLU(), nn.Linear(48, 8))
    _, linear = quant_linear()
    assert swap_in_fp8_linears(model, {"0.": linear}, torch.float32, "cpu") == 1
    assert isinstance(model[0], Fp8Linear) and isinstance(model[2], nn.Linear)
    assert model(seeded(2, 32)).shape == (2, 8)


def fmt(layout: str = "modelopt_native", state: bool = True, quant: dict | None = None):
    folder = Path("/ckpt/transformer")
    quant = quant or {"quant_method": "modelopt", "quant_type": "FP8", "modelopt_config": {}}
    return QuantFormat(layout, folder, 1, folder / "modelopt_state.pth" if state else None, "",
                       quant)


@pytest.mark.parametrize("generator", [True, False])
def test_cpu_chooses_w8a16_and_refuses_an_explicit_w8a8(generator):
    mode, why = load.choose_compute("auto", "cpu", fmt=fmt(), generator=generator)
    assert mode == "w8a16" and "not a CUDA GPU" in why
    assert load.choose_compute("w8a16", "cpu", fmt=fmt(), generator=generator)[0] == "w8a16"
    with pytest.raises(Fp8FormatError, match="fp8_compute is w8a8 but device 'cpu'"):
        load.choose_compute("w8a8", "cpu", fmt=fmt(), generator=generator)


def test_w8a8_needs_capability_8_9_and_for_the_generator_the_native_state(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert "compute capability (8, 0)" in load.choose_compute(
        "auto", "cuda", fmt=fmt(), generator=False)[1]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert load.choose_compute("auto", "cuda", fmt=fmt(), generator=False)[0] == "w8a8"
    mode, why = load.choose_compute("auto", "cuda", fmt=fmt("modelopt_exported"),
                                    generator=True)
    assert mode == "w8a16" and "native layout" in why
    mode, why = load.choose_compute("auto", "cuda", fmt=fmt(), generator=True)
    assert mode == "w8a16" and "set fp8_compute: w8a8" in why  # unverified: only when asked
    assert load.choose_compute("w8a8", "cuda", fmt=fmt(), generator=True)[0] == "w8a8"
    bare = fmt(quant={"quant_method": "modelopt", "quant_type": "FP8"})  # modelopt 0.47 here
    assert "modelopt_config" in load.choose_compute("auto", "cuda", fmt=bare, generator=True)[1]
    algo = fmt(quant={"quant_method": "modelopt", "quant_algo": "FP8"})
    assert "quant_type" in load.choose_compute("auto", "cuda", fmt=algo, generator=True)[1]
    with pytest.raises(Fp8FormatError, match="fp8_compute is w8a8 but .*quant_type"):
        load.choose_compute("w8a8", "cuda", fmt=algo, generator=True)
    with pytest.raises(ValueError, match="fp8_compute must be"):
        load.choose_compute("fp8", "cuda", fmt=fmt(), generator=True)
