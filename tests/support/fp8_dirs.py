"""Tiny Cosmos3 directories (generator + reasoner) with ModelOpt FP8 weights, each beside its
reference: the same directory with every FP8 weight dequantised into plain float32 weights."""

from __future__ import annotations

import shutil
from pathlib import Path

from worldserve.levers.fp8 import dev

# The generator's `quantization_config` as diffusers' ModelOpt quantizer spells it (quant_type);
# the reasoner's as ModelOpt's HF export does (quant_algo): both spellings are in use.
GENERATOR_CONFIG = {"quant_method": "modelopt", "quant_type": "FP8"}
LAYOUTS = ("exported", "native")


def quantise(model_dir: Path, layout: str) -> None:
    """Quantise the generator transformer and the root reasoner of `model_dir` in place.

    exported: by hand, `weight_scale` / `input_scale` + quantization_config (both towers);
    native: the generator through ModelOpt itself (`mtq.quantize` + `compress`, its
    transformer/modelopt_state.pth and the root copy of the published fp8 revision), the
    reasoner's native tensor names by hand.
    """
    transformer = model_dir / "transformer"
    if layout == "exported":
        dev.quantise_exported(transformer, transformer / "config.json",
                              quant_config=GENERATOR_CONFIG)
        dev.quantise_exported(model_dir, model_dir / "config.json")
    elif layout == "native":
        dev.quantise_generator_native(model_dir, root_state=True)
        dev.quantise_native_by_hand(model_dir)
    else:
        raise ValueError(layout)


def dequantised_copy(model_dir: Path, target: Path) -> Path:
    """`model_dir` with every FP8 weight written back dequantised (plain float32)."""
    shutil.copytree(model_dir, target)
    dev.write_dequantised(target / "transformer", target / "transformer" / "config.json")
    dev.write_dequantised(target, target / "config.json")
    return target


def fp8_pair(base: Path, root: Path, layout: str) -> tuple[Path, Path]:
    """(FP8 directory, its dequantised reference), both under `root`."""
    quantised = root / f"fp8-{layout}"
    shutil.copytree(base, quantised)
    quantise(quantised, layout)
    return quantised, dequantised_copy(quantised, root / f"ref-{layout}")
