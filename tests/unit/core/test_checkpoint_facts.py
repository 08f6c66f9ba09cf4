"""What each stage would load, read from headers only, against the tensors themselves."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from worldserve.config import ServerConfig
from worldserve.runtime.checkpoint_facts import stage_demands, stage_facts
from worldserve.runtime.placement import plan_placement


def loaded_numel(model_dir: Path, files: list[str]) -> dict[str, int]:
    """Elements per dtype of the tensors as safetensors loads them."""
    out: dict[str, int] = {}
    for name in files:
        with safe_open(str(model_dir / name), "pt") as f:
            for key in f.keys():
                t = f.get_tensor(key)
                out[str(t.dtype)] = out.get(str(t.dtype), 0) + t.numel()
    return out


def test_header_counts_equal_the_loaded_tensors(dev_models_dir: Path) -> None:
    cosmos = dev_models_dir / "generation"
    gen, reasoner = stage_facts("generation", cosmos), stage_facts("reasoner", cosmos)
    assert gen.family == "cosmos3" and reasoner.family == "cosmos3_reasoner"
    assert gen.layout.startswith("published") and gen.quantisation is None
    gen_files = [f.path for f in gen.files]
    assert "transformer/diffusion_pytorch_model.safetensors" in gen_files
    assert "vae/diffusion_pytorch_model.safetensors" in gen_files
    assert [f.path for f in reasoner.files] == ["model.safetensors"]  # the root, not the parts
    assert loaded_numel(cosmos, gen_files) == {"torch.float32": gen.dtype_numel["F32"]}
    assert sum(f.num_bytes for f in gen.files) == sum(
        (cosmos / p).stat().st_size for p in gen_files)
    assert gen.arch.hidden_size == 32 and gen.arch.vae_width == 8
    assert reasoner.arch.num_layers == 2 and reasoner.arch.num_kv_heads == 1


def test_demands_follow_the_config(dev_models_dir: Path) -> None:
    cosmos = str(dev_models_dir / "generation")
    config = ServerConfig.model_validate({"stages": {
        "generation": {"model_path": cosmos, "dtype": "bfloat16",
                       "parallel": {"cfg": 2, "ulysses": 2}},
        "reasoner": {"model_path": cosmos, "device": "cpu"},
        "realtime": {"enabled": False}}})
    demands, facts = stage_demands(config)
    by_stage = {d.stage: d for d in demands}
    assert set(by_stage) == set(facts) == {"generation", "reasoner"}
    assert by_stage["generation"].world_size == 4 and by_stage["generation"].seq_split == 2
    plan = plan_placement([], demands)
    # float32 tensors counted in the configured dtype
    assert plan.stages["generation"].weight_bytes == facts["generation"].dtype_numel["F32"] * 2
    assert plan.stages["reasoner"].dtype == "float32"


def test_fp8_weights_and_their_config_are_reported(dev_models_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "fp8"
    shutil.copytree(dev_models_dir / "generation", model)
    weights = model / "transformer" / "diffusion_pytorch_model.safetensors"
    tensors = {}
    with safe_open(str(weights), "pt") as f:
        for key in f.keys():
            tensors[key] = f.get_tensor(key)
    linear = [k for k, t in tensors.items() if k.endswith(".weight") and t.dim() == 2]
    for key in linear:
        tensors[key] = tensors[key].to(torch.float8_e4m3fn)
    save_file(tensors, str(weights))
    facts = stage_facts("generation", model)
    assert facts.quantisation == "F8_E4M3 tensors without a quantization_config"
    assert facts.dtype_numel["F8_E4M3"] == sum(tensors[k].numel() for k in linear)
    config_path = model / "transformer" / "config.json"
    config = json.loads(config_path.read_text())
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "FP8"}
    config_path.write_text(json.dumps(config))
    assert stage_facts("generation", model).quantisation == (
        "quant_method=modelopt, quant_algo=FP8 (transformer/config.json quantization_config)")
    (model / "modelopt_state.pth").write_bytes(b"")
    config.pop("quantization_config")
    config_path.write_text(json.dumps(config))
    assert stage_facts("generation", model).quantisation == (
        "modelopt (modelopt_state.pth), F8_E4M3 tensors")


def test_a_fake_backend_never_takes_a_gpu() -> None:
    from worldserve.runtime.placement import GpuInfo

    config = ServerConfig.model_validate({"stages": {
        "generation": {"enabled": False}, "realtime": {"enabled": False},
        "reasoner": {"backend": "fake", "device": "cuda"}}})
    demands, facts = stage_demands(config)
    assert facts["reasoner"].family == "fake" and demands[0].device == "cpu"
    plan = plan_placement([GpuInfo(0, "gpu", 80 << 30, (9, 0))], demands)
    assert plan.stages["reasoner"].device == "cpu" and plan.fits


def test_blocks_fp8_compute_and_communicators_reach_the_demand(dev_models_dir: Path) -> None:
    cosmos = dev_models_dir / "generation"
    config = ServerConfig.model_validate({"stages": {
        "generation": {"model_path": str(cosmos), "fp8_compute": "w8a8",
                       "parallel": {"cfg": 2, "ulysses": 2, "shard": 4}},
        "reasoner": {"model_path": str(cosmos)}, "realtime": {"enabled": False}}})
    demands, facts = stage_demands(config)
    gen = next(d for d in demands if d.stage == "generation")
    assert gen.fp8_compute == "w8a8" and gen.num_communicators == 4  # world, sp, ulysses, cfg
    with safe_open(str(cosmos / "transformer" / "diffusion_pytorch_model.safetensors"),
                   "pt") as f:
        blocks = sum(math.prod(f.get_slice(k).get_shape())
                     for k in f.keys() if k.startswith("layers."))
    assert gen.sharded_numel == {"F32": blocks} and 0 < blocks < gen.dtype_numel["F32"]
    reasoner = next(d for d in demands if d.stage == "reasoner")
    # an unchunked decode never overlaps a step (the plan takes the larger); the reasoner has
    # no decode, and keeps the sum
    assert not gen.decode_interleaves and reasoner.decode_interleaves


def test_a_chunked_decode_is_planned_beside_the_steps(dev_models_dir: Path) -> None:
    cosmos = dev_models_dir / "generation"
    config = ServerConfig.model_validate({"stages": {
        "generation": {"model_path": str(cosmos), "vae_decode_chunk_frames": 1},
        "reasoner": {"enabled": False}, "realtime": {"enabled": False}}})
    (gen,), _ = stage_demands(config)
    assert gen.decode_interleaves


def test_a_sharded_folder_counts_what_its_index_names(dev_models_dir: Path,
                                                      tmp_path: Path) -> None:
    """A folder with an index holds the tensors its weight map names: a stale file beside it
    is not counted, and a file the map names only in part counts only those tensors."""
    model = tmp_path / "indexed"
    shutil.copytree(dev_models_dir / "generation", model)
    before = stage_facts("reasoner", model).dtype_numel
    weights = model / "model.safetensors"
    with safe_open(str(weights), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    names = sorted(tensors)
    weights.unlink()
    save_file({k: tensors[k] for k in names[:3]}, str(model / "model-00001-of-00002.safetensors"))
    save_file(tensors, str(model / "model-00002-of-00002.safetensors"))  # also holds the first 3
    weight_map = {k: ("model-00001-of-00002.safetensors" if i < 3
                      else "model-00002-of-00002.safetensors") for i, k in enumerate(names)}
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    save_file({"stale": torch.zeros(1000)}, str(model / "stale.safetensors"))
    facts = stage_facts("reasoner", model)
    assert facts.dtype_numel == before
    assert [f.path for f in facts.files] == ["model-00001-of-00002.safetensors",
                                             "model-00002-of-00002.safetensors"]
