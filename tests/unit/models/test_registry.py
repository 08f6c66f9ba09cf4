"""Model directory -> family detection (JSON only) and the unknown-directory message."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from worldserve.models import registry
from worldserve.models.types import ModelLoadError


def write(directory: Path, name: str, data: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(json.dumps(data))
    return directory


@pytest.mark.parametrize("stage, name, data, family", [
    ("generation", "model_index.json", {"_class_name": "WanPipeline"}, "wan"),
    ("generation", "model_index.json", {"_class_name": "WanImageToVideoPipeline"}, "wan"),
    ("generation", "model_index.json", {"_class_name": "Cosmos3OmniPipeline"}, "cosmos3"),
    ("reasoner", "config.json", {"model_type": "qwen2_5_vl"}, "qwen_vl"),
    ("reasoner", "config.json", {"model_type": "qwen3_vl"}, "qwen_vl"),
    ("reasoner", "config.json", {"model_type": "cosmos3_omni"}, "cosmos3_reasoner"),
    ("reasoner", "config.json", {"model_type": "cosmos3_edge"}, "cosmos3_reasoner"),
    ("realtime", "realtime_config.json", {"pipeline": "WorldserveCausalWanPipeline"},
     "causal_dit"),
    ("realtime", "model_index.json", {"_class_name": "SanaWMPipeline"}, "sana_wm"),
    ("actions", "config.json", {"action_dim": 7, "action_horizon": 16, "state_dim": 8},
     "action_head"),
])
def test_detects_each_family(tmp_path, stage, name, data, family):
    assert registry.resolve(stage, write(tmp_path, name, data)).name == family


def test_unknown_directory_names_what_was_found_and_the_families(tmp_path):
    model = write(tmp_path / "m", "model_index.json", {"_class_name": "FluxPipeline"})
    with pytest.raises(ModelLoadError) as info:
        registry.resolve("generation", model)
    message = str(info.value)
    assert "_class_name='FluxPipeline'" in message and "families: cosmos3, wan" in message
    with pytest.raises(ModelLoadError, match="no model_index.json, config.json"):
        registry.resolve("reasoner", tmp_path / "empty")


def test_a_family_serves_only_its_stage_kinds(tmp_path):
    model = write(tmp_path, "config.json", {"model_type": "qwen2_5_vl"})
    with pytest.raises(ModelLoadError,
                       match="supported realtime families: cosmos3, causal_dit, sana_wm"):
        registry.resolve("realtime", model)


def test_every_loader_entry_point_exists():
    import importlib.util

    for family in registry.FAMILIES:
        for stage, target in family.loaders.items():
            module_name, function_name = target.split(":")
            assert importlib.util.find_spec(module_name) is not None, (family.name, stage)
            source = Path(importlib.util.find_spec(module_name).origin).read_text()
            assert f"def {function_name}(" in source, target


def test_detection_imports_no_model_library(tmp_path):
    write(tmp_path, "config.json", {"model_type": "qwen3_vl"})
    code = ("import sys; from pathlib import Path; from worldserve.models import registry; "
            f"registry.resolve('reasoner', Path({str(tmp_path)!r})); "
            "print(sorted(m for m in ('torch', 'transformers', 'diffusers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_one_directory_serves_generation_and_reasoner(tmp_path):
    """A Cosmos3-style directory: a diffusers generator beside a transformers reasoner; the cli
    points every stage it detects at it, so `--model-path DIR` needs no further flags."""
    from worldserve.cli import _model_overrides

    model = write(tmp_path / "both", "model_index.json", {"_class_name": "WanPipeline"})
    write(model, "config.json", {"model_type": "cosmos3_omni"})
    assert registry.stage_kinds(model) == ["generation", "reasoner"]
    assert _model_overrides(model) == {"stages.generation.model_path": str(model),
                                       "stages.reasoner.model_path": str(model)}
    generator_only = write(tmp_path / "gen", "model_index.json", {"_class_name": "WanPipeline"})
    assert _model_overrides(generator_only) == {
        "stages.generation.model_path": str(generator_only)}
