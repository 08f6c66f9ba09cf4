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


def plugin_site(site: Path, entries: dict[str, str]) -> Path:
    """An installed plugin distribution's metadata: entry points in `registry.PLUGIN_GROUP`."""
    dist = site / "worldserve_test_plugin-0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: worldserve-test-plugin\n"
                                   "Version: 0.0\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entries.items())
    (dist / "entry_points.txt").write_text(f"[{registry.PLUGIN_GROUP}]\n{lines}")
    return site


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """Install plugin entry points for one test (the registry caches what it found)."""
    def install(**entries: str) -> None:
        monkeypatch.syspath_prepend(str(plugin_site(tmp_path / "site", entries)))
        registry._plugin_families.cache_clear()

    yield install
    registry._plugin_families.cache_clear()


def test_a_plugin_family_comes_after_the_built_in_ones(tmp_path, plugins):
    plugins(toy="tests.integration.generation.toy_family:FAMILY")
    assert [f.name for f in registry.families()] == [f.name for f in registry.FAMILIES] + ["toy"]
    model = write(tmp_path / "toy", "model_index.json", {"_class_name": "ToyPipeline"})
    assert registry.resolve("generation", model).name == "toy"
    assert registry.supported("generation") == ["cosmos3", "wan", "toy"]


def test_a_plugin_that_is_not_a_family_is_refused_by_name(plugins):
    plugins(broken="tests.integration.generation.toy_family:DEFAULTS")
    with pytest.raises(ModelLoadError, match="plugin broken .* is a GenerationDefaults"):
        registry.families()


def test_checkpoint_defaults_real_dev_and_marker_overrides(tmp_path):
    from worldserve.models.dev import MARKER_NAME, checkpoint_defaults
    from worldserve.models.wan.family import DEFAULTS, DEV_DEFAULTS

    assert checkpoint_defaults(tmp_path, DEFAULTS, DEV_DEFAULTS) == DEFAULTS
    (tmp_path / MARKER_NAME).write_text("not json")
    assert checkpoint_defaults(tmp_path, DEFAULTS, DEV_DEFAULTS) == DEV_DEFAULTS
    marker = {"sampling_defaults": {"num_inference_steps": 100, "unknown": 1}}
    (tmp_path / MARKER_NAME).write_text(json.dumps(marker))
    got = checkpoint_defaults(tmp_path, DEFAULTS, DEV_DEFAULTS)
    assert got.num_inference_steps == 100 and got.width == DEV_DEFAULTS.width
