"""build_dev_models: layout, markers, skipping, atomic replacement, byte-level determinism."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from worldserve.models import dev
from worldserve.models.dev import (
    BUILDERS,
    DEV_MODELS_VERSION,
    MARKER_NAME,
    DevModelBuilder,
    build_dev_models,
    dev_model_ready,
    dev_models_ready,
    read_marker,
)

REASONER_FILES = {
    "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
    "tokenizer_config.json", "chat_template.jinja", "preprocessor_config.json", MARKER_NAME,
}
GENERATION_FILES = {  # the tiny Cosmos3 generator (diffusers layout) + its reasoner at the root
    "model_index.json", "scheduler/scheduler_config.json", "text_tokenizer/tokenizer.json",
    "text_tokenizer/tokenizer_config.json", "text_tokenizer/chat_template.jinja",
    "transformer/config.json", "transformer/diffusion_pytorch_model.safetensors",
    "vae/config.json", "vae/diffusion_pytorch_model.safetensors", "sound_tokenizer/config.json",
    "sound_tokenizer/diffusion_pytorch_model.safetensors",
} | REASONER_FILES
WAN_FILES = {
    "model_index.json", "scheduler/scheduler_config.json", "text_encoder/config.json",
    "text_encoder/model.safetensors", "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json",
    "tokenizer/chat_template.jinja", "transformer/config.json",
    "transformer/diffusion_pytorch_model.safetensors", "vae/config.json",
    "vae/diffusion_pytorch_model.safetensors", MARKER_NAME,
    "action_head/config.json", "action_head/model.safetensors",  # serves /v1/actions/*
}


def _file_hashes(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def dev_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dev-models")
    build_dev_models(root)
    return root


def test_build_writes_hf_layouts_with_markers(dev_root: Path) -> None:
    assert set(_file_hashes(dev_root / "reasoner")) == REASONER_FILES
    assert set(_file_hashes(dev_root / "generation")) == GENERATION_FILES
    assert set(_file_hashes(dev_root / "wan")) == WAN_FILES
    assert sorted(p.name for p in dev_root.iterdir()) == sorted(BUILDERS)
    assert read_marker(dev_root / "reasoner")["served_model_name"] == "worldserve-dev-reasoner"
    assert read_marker(dev_root / "generation")["served_model_name"] == "worldserve-dev-cosmos3"
    assert read_marker(dev_root / "wan")["served_model_name"] == "worldserve-dev-wan"
    for name in ("reasoner", "generation", "wan"):
        marker = read_marker(dev_root / name)
        assert marker["name"] == name
        assert marker["version"] == DEV_MODELS_VERSION
        assert marker["seed"] == dev.DEV_MODELS_SEED
    assert dev_models_ready(dev_root)


def test_second_build_is_byte_identical(dev_root: Path, tmp_path: Path) -> None:
    build_dev_models(tmp_path)
    for name in ("reasoner", "generation", "wan"):
        assert _file_hashes(tmp_path / name) == _file_hashes(dev_root / name), name


def test_build_in_another_process_is_byte_identical(dev_root: Path, tmp_path: Path) -> None:
    """Another interpreter with another hash seed (tokenizer training, dict order) agrees."""
    repo_root = Path(dev.__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONHASHSEED": "12345", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(repo_root)}
    code = (
        "import sys, pathlib; from worldserve.models.dev import build_dev_models; "
        "build_dev_models(pathlib.Path(sys.argv[1]))"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, check=True, timeout=120)
    for name in ("reasoner", "generation", "wan"):
        assert _file_hashes(tmp_path / name) == _file_hashes(dev_root / name), name


def test_build_leaves_the_callers_rng_alone(tmp_path: Path) -> None:
    torch.manual_seed(1234)
    expected = torch.rand(4)
    torch.manual_seed(1234)
    build_dev_models(tmp_path, force=True)
    assert torch.equal(torch.rand(4), expected)


def test_directory_without_marker_is_not_ready(dev_root: Path, tmp_path: Path) -> None:
    assert not dev_models_ready(tmp_path)
    for name in BUILDERS:
        copy = tmp_path / name
        shutil.copytree(dev_root / name, copy)
        assert dev_model_ready(copy, name)
    (tmp_path / "generation" / MARKER_NAME).unlink()
    assert not dev_model_ready(tmp_path / "generation", "generation")
    assert not dev_models_ready(tmp_path)


def test_marker_of_another_version_or_name_is_not_ready(tmp_path: Path) -> None:
    (tmp_path / "reasoner").mkdir()
    marker = {"name": "reasoner", "version": "0-old", "seed": 0}
    (tmp_path / "reasoner" / MARKER_NAME).write_text(json.dumps(marker))
    assert not dev_model_ready(tmp_path / "reasoner", "reasoner")
    marker.update(version=DEV_MODELS_VERSION, name="generation")
    (tmp_path / "reasoner" / MARKER_NAME).write_text(json.dumps(marker))
    assert not dev_model_ready(tmp_path / "reasoner", "reasoner")
    (tmp_path / "reasoner" / MARKER_NAME).write_text("{not json")
    assert read_marker(tmp_path / "reasoner") is None


def _fake_builder(calls: list[str], fail: bool = False) -> DevModelBuilder:
    """A DevModelBuilder whose entry point is replaced by a recording function."""

    class Recording(DevModelBuilder):
        def __call__(self, target_dir: Path, seed: int) -> None:
            calls.append(target_dir.name)
            (target_dir / "weights.bin").write_bytes(b"x" * len(calls))
            if fail:
                raise RuntimeError("builder failed")

    return Recording("worldserve-dev-fake", "unused:unused")


def test_build_skips_ready_models_unless_forced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(dev, "BUILDERS", {"fake": _fake_builder(calls)})
    assert build_dev_models(tmp_path) == {"fake": tmp_path / "fake"}
    assert build_dev_models(tmp_path) == {"fake": tmp_path / "fake"}
    assert len(calls) == 1
    build_dev_models(tmp_path, force=True)
    assert len(calls) == 2
    assert (tmp_path / "fake" / "weights.bin").read_bytes() == b"xx"
    assert read_marker(tmp_path / "fake")["served_model_name"] == "worldserve-dev-fake"
    assert [p.name for p in tmp_path.iterdir()] == ["fake"]  # no temporary dirs left behind


def test_failed_build_keeps_the_previous_model_and_no_partial_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(dev, "BUILDERS", {"fake": _fake_builder(calls)})
    build_dev_models(tmp_path)
    monkeypatch.setattr(dev, "BUILDERS", {"fake": _fake_builder(calls, fail=True)})
    with pytest.raises(RuntimeError, match="builder failed"):
        build_dev_models(tmp_path, force=True)
    assert (tmp_path / "fake" / "weights.bin").read_bytes() == b"x"
    assert dev_models_ready(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["fake"]


def test_first_build_failure_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dev, "BUILDERS", {"fake": _fake_builder([], fail=True)})
    with pytest.raises(RuntimeError):
        build_dev_models(tmp_path)
    assert list(tmp_path.iterdir()) == []
    assert not dev_models_ready(tmp_path)
