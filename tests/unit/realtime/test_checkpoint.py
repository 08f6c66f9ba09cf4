"""The dev checkpoint round-trips through the on-disk layout the stage loads."""

from __future__ import annotations

import json

import pytest
import torch

from worldserve.engines.common import ModelLoadError
from worldserve.models.causal_dit.dev import build_realtime
from worldserve.models.causal_dit.loader import load_realtime_model


def test_saved_checkpoint_loads_with_identical_weights(tmp_path, rt_model):
    build_realtime(tmp_path, 0)
    assert (tmp_path / "realtime_config.json").is_file()
    loaded = load_realtime_model(tmp_path)
    for (name, a), (_, b) in zip(rt_model.dit.state_dict().items(),
                                 loaded.dit.state_dict().items()):
        assert torch.equal(a, b), name
    kv_a = rt_model.encode_prompt("a red car")
    kv_b = loaded.encode_prompt("a red car")
    assert all(torch.equal(x[0], y[0]) for x, y in zip(kv_a, kv_b))
    assert loaded.config == rt_model.config


def test_foreign_diffusers_layout_is_refused_with_a_message(tmp_path):
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "AnyFlowFARPipeline"}))
    with pytest.raises(ModelLoadError, match="AnyFlowFARPipeline"):
        load_realtime_model(tmp_path)


def test_build_is_deterministic(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir(), second.mkdir()
    build_realtime(first, 0)
    build_realtime(second, 0)
    files = sorted(p.relative_to(first) for p in first.rglob("*") if p.is_file())
    assert files
    for rel in files:
        assert (first / rel).read_bytes() == (second / rel).read_bytes(), rel
