"""Format detection from files, for each published layout and every refusal: headers and configs
only, tiny synthetic tensors (the model-level equivalences are in test_cosmos3_fp8.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from worldserve.levers.fp8.detect import Fp8FormatError, detect
from worldserve.levers.fp8.dev import quantise_weight
from worldserve.levers.fp8.load import generator_format, reasoner_format

EXPORTED = {"quant_method": "modelopt", "quant_algo": "FP8"}


def linear(prefix: str, layout: str, seed: int = 0) -> dict[str, torch.Tensor]:
    weight = torch.randn(16, 16, generator=torch.Generator().manual_seed(seed))
    fp8, scale = quantise_weight(weight)
    names = {"exported": ("weight_scale", "input_scale"),
             "native": ("weight_quantizer._scale", "input_quantizer._amax")}[layout]
    return {f"{prefix}.weight": fp8, f"{prefix}.{names[0]}": scale,
            f"{prefix}.{names[1]}": torch.tensor(0.5)}


def write(folder: Path, tensors: dict[str, torch.Tensor], config: dict | None = None,
          name: str = "model.safetensors") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / name)
    (folder / "config.json").write_text(json.dumps(config or {}))
    return folder


def plain() -> dict[str, torch.Tensor]:
    return {"norm.weight": torch.ones(16), "proj.weight": torch.zeros(16, 16)}


def test_exported_layout_is_detected_with_its_count(tmp_path):
    folder = write(tmp_path, {**plain(), **linear("a", "exported"), **linear("b", "exported")},
                   {"quantization_config": EXPORTED})
    fmt = detect(folder, folder / "config.json")
    assert fmt.layout == "modelopt_exported" and fmt.num_fp8_weights == 2
    assert "quant_algo" in fmt.evidence and fmt.state_file is None


def test_native_layout_is_detected_without_any_config_entry(tmp_path):
    folder = write(tmp_path, {**plain(), **linear("a", "native")})
    (folder / "modelopt_state.pth").write_bytes(b"state")
    fmt = detect(folder, folder / "config.json")
    assert fmt.layout == "modelopt_native" and fmt.num_fp8_weights == 1
    assert fmt.state_file == folder / "modelopt_state.pth"


@pytest.mark.parametrize("quant, message", [
    ({"quant_method": "gptq", "bits": 4}, "quant_method 'gptq' is not one worldserve loads"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "algorithm 'NVFP4'"),
    ({"quant_method": "modelopt", "quant_type": "INT8"}, "algorithm 'INT8'"),
    ({"quant_method": "modelopt", "quant_type": "FP8_INT8"}, "algorithm 'FP8_INT8'"),
    ({"bits": 8}, "names neither quant_method nor quant_algo"),
    ("fp8", "is 'fp8', not an object"),
])
def test_an_unknown_quantisation_is_a_startup_error_naming_it(tmp_path, quant, message):
    folder = write(tmp_path, {**plain(), **linear("a", "exported")},
                   {"quantization_config": quant})
    with pytest.raises(Fp8FormatError, match=message):
        detect(folder, folder / "config.json")


def test_diffusers_weight_activation_spelling_is_fp8(tmp_path):
    quant = {"quant_method": "modelopt", "quant_type": "FP8_FP8"}
    folder = write(tmp_path, {**plain(), **linear("a", "exported")}, {"quantization_config": quant})
    assert detect(folder, folder / "config.json").layout == "modelopt_exported"


def test_fp8_weights_without_any_scale_are_refused(tmp_path):
    tensors = {k: v for k, v in linear("a", "exported").items() if k == "a.weight"}
    folder = write(tmp_path, {**plain(), **tensors}, {"quantization_config": EXPORTED})
    with pytest.raises(Fp8FormatError, match="FP8 tensors but no scales"):
        detect(folder, folder / "config.json")


def test_a_quantisation_config_over_plain_weights_is_refused(tmp_path):
    folder = write(tmp_path, plain(), {"quantization_config": EXPORTED})
    with pytest.raises(Fp8FormatError, match="no FP8 tensors"):
        detect(folder, folder / "config.json")


def test_e5m2_weights_are_refused(tmp_path):
    tensors = linear("a", "exported")
    tensors["a.weight"] = tensors["a.weight"].float().to(torch.float8_e5m2)
    folder = write(tmp_path, tensors, {"quantization_config": EXPORTED})
    with pytest.raises(Fp8FormatError, match="F8_E5M2 tensors .*E4M3 only"):
        detect(folder, folder / "config.json")


def test_a_modelopt_state_beside_plain_weights_is_plain(tmp_path):
    folder = write(tmp_path, plain())
    (folder / "modelopt_state.pth").write_bytes(b"state")
    assert detect(folder, folder / "config.json") is None


def published(root: Path, revision: str) -> Path:
    """A one-directory Cosmos3 layout: sharded transformer (+ index) and the root reasoner.
    `main`: BF16; `fp8`: native FP8 transformer with its modelopt_state.pth, the root
    modelopt_state.pth (HF discussion #24) and diffusers' quantization_config spelling; the
    root reasoner in the exported layout."""
    transformer = root / "transformer"
    quantised = revision == "fp8"
    shards = [{**plain(), **(linear("layers.0.q", "native") if quantised else {})},
              {"layers.1.k.weight": torch.zeros(16, 16).bfloat16(),
               **(linear("layers.1.v", "native", 1) if quantised else {})}]
    weight_map = {}
    for i, tensors in enumerate(shards, 1):
        name = f"diffusion_pytorch_model-0000{i}-of-00002.safetensors"
        write(transformer, tensors, name=name)
        weight_map.update(dict.fromkeys(tensors, name))
    (transformer / "diffusion_pytorch_model.safetensors.index.json").write_text(
        json.dumps({"weight_map": weight_map}))
    config = {"quantization_config": {"quant_method": "modelopt", "quant_type": "FP8"}}
    (transformer / "config.json").write_text(json.dumps(config if quantised else {}))
    reasoner = {**plain(), **(linear("layers.0.self_attn.to_q", "exported") if quantised else {})}
    write(root, reasoner, {"model_type": "cosmos3_omni",
                           **({"quantization_config": EXPORTED} if quantised else {})})
    if quantised:
        (transformer / "modelopt_state.pth").write_bytes(b"state")
        (root / "modelopt_state.pth").write_bytes(b"state")
    return root


def test_published_main_revision_is_plain(tmp_path):
    root = published(tmp_path, "main")
    assert generator_format(root) is None and reasoner_format(root) is None


def test_published_fp8_revision_is_detected_for_both_stages(tmp_path):
    root = published(tmp_path, "fp8")
    generator = generator_format(root)
    assert generator.layout == "modelopt_native" and generator.num_fp8_weights == 2
    assert generator.state_file == root / "transformer" / "modelopt_state.pth"
    reasoner = reasoner_format(root)
    assert reasoner.layout == "modelopt_exported" and reasoner.num_fp8_weights == 1
    assert reasoner.state_file == root / "modelopt_state.pth"


def test_only_the_root_modelopt_state_still_finds_the_generator_state(tmp_path):
    root = published(tmp_path, "fp8")
    (root / "transformer" / "modelopt_state.pth").unlink()
    assert generator_format(root).state_file == root / "modelopt_state.pth"
