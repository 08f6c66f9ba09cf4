"""Decode paths give the same tokens: the static decode step (`models/qwen_vl/decode.py`) equals
transformers' forward, compiled or not, one sequence or a packed batch, with drafts; and the
engine's device-side sampler gives the replies the pre-batching scalar sampler gives."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.unit.reasoner.conftest import GREEDY, Driver
from tests.unit.reasoner.drive import concurrent_replies, windowed_greedy_replies
from tests.unit.reasoner.scalar_sampler import reference_rows
from tests.unit.reasoner.tiny_vlm import frame_bytes
from worldserve.config import ReasonerStageConfig, ServerConfig, StreamingConfig
from worldserve.models import registry

SAMPLED = {"max_tokens": 10, "temperature": 0.8, "top_p": 0.9, "seed": 11,
           "repetition_penalty": 1.2, "frequency_penalty": 0.3}


def _engine(model_dir: Path, **stage) -> Driver:
    from worldserve.engines.reasoner.engine import ReasonerEngine

    streaming = StreamingConfig(max_sessions=3, **stage.pop("streaming", {}))
    config = ReasonerStageConfig(model_path=model_dir, streaming=streaming, **stage)
    return Driver(ReasonerEngine(config, ServerConfig()))


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl", "cosmos3_omni",
                                        "cosmos3_edge"])
def model_dir(request, tiny_dir, tiny_qwen3_dir, cosmos3_dir_of) -> Path:
    return {"qwen2_5_vl": tiny_dir, "qwen3_vl": tiny_qwen3_dir}.get(
        request.param) or cosmos3_dir_of(request.param)


@pytest.fixture(scope="module")
def cosmos3_dir_of(tmp_path_factory):
    from worldserve.models.cosmos3_reasoner.dev import write_reasoner_files

    made: dict[str, Path] = {}

    def build(model_type: str) -> Path:
        if model_type not in made:
            made[model_type] = tmp_path_factory.mktemp(model_type)
            write_reasoner_files(made[model_type], 0, model_type)
        return made[model_type]

    return build


@torch.no_grad()
def _distinct_norms(model) -> None:
    gen = torch.Generator().manual_seed(0)
    for name, param in model.named_parameters():
        if "norm" in name and name.endswith("weight"):
            param.copy_(1 + 0.5 * torch.randn(param.shape, generator=gen))


def _prefilled(runner, prompts):
    kvs = [runner.new_kv() for _ in prompts]
    for kv, ids in zip(kvs, prompts):
        runner.forward(kv, ids)
    return kvs


def test_static_step_equals_transformers_forward(model_dir):
    """Logits and caches of static steps (one sequence; a packed batch with uneven draft
    widths and a member leaving) equal transformers' forward of the same steps."""
    static, eager = (registry.load_runner("reasoner", model_dir) for _ in range(2))
    for runner in (static, eager):  # dev norms are all ones: give each a weight of its own
        _distinct_norms(runner.model)
    assert static.configure_decode(True) == "static" and eager.configure_decode(False) == "eager"
    prompts = [[5, 9, 13, 2], list(range(20, 31)), [7] * 6]
    ours, ref = _prefilled(static, prompts), _prefilled(eager, prompts)
    steps = [[[3]], [[4, 5, 6]], [[3], [4, 5, 6], [8, 9]], [[10], [12], [13]], [[14, 15], [16]]]
    for fed in steps:
        n = len(fed)
        got = static.forward_decode_batch(ours[:n], fed)
        expected = eager.forward_decode_batch(ref[:n], fed)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        ours[0].truncate(len(ours[0]) - 1)  # a rejected draft
        ref[0].truncate(len(ref[0]) - 1)
    for a, b in zip(ours, ref):
        assert a.ids == b.ids and torch.equal(a.positions, b.positions)
        for la, lb in zip(a.cache.layers, b.cache.layers):
            torch.testing.assert_close(la.keys, lb.keys, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(la.values, lb.values, atol=1e-5, rtol=1e-5)


def test_static_decode_is_on_by_default_and_token_identical(model_dir):
    static, eager = _engine(model_dir), _engine(model_dir, static_decode=False)
    assert static.engine.decode_path == "static" and eager.engine.decode_path == "eager"
    assert windowed_greedy_replies(static) == windowed_greedy_replies(eager)


@pytest.mark.parametrize("sampling", [{"max_tokens": 10, **GREEDY}, SAMPLED])
def test_batched_static_decode_with_drafts_equals_eager(tiny_dir, sampling):
    static = _engine(tiny_dir, streaming={"spec_method": "ngram"})
    eager = _engine(tiny_dir, static_decode=False, streaming={"spec_method": "ngram"})
    assert concurrent_replies(static, sampling) == concurrent_replies(eager, sampling)
    assert static.engine.stats()["extra"]["spec_drafted"] > 0


def test_compiled_static_step_is_off_by_default_and_token_identical(tiny_dir):
    assert ReasonerStageConfig().compile_decode is False
    compiled = _engine(tiny_dir, compile_decode=True)
    compiled.create(sampling={"max_tokens": 6, **GREEDY})
    eager = _engine(tiny_dir, static_decode=False)
    eager.create(sampling={"max_tokens": 6, **GREEDY})
    for i in range(2):
        assert compiled.frame("s1", frame_bytes(i)).text == eager.frame("s1", frame_bytes(i)).text
    assert compiled.engine.sessions["s1"].kv.ids == eager.engine.sessions["s1"].kv.ids


@pytest.mark.parametrize("sampling", [
    SAMPLED,
    {"max_tokens": 12, "temperature": 0.3, "top_p": 0.9, "seed": 5},  # the server defaults
    {"max_tokens": 12, "temperature": 1.5, "top_k": 40, "seed": 2, "presence_penalty": 0.5},
    {"max_tokens": 12, "temperature": 0.7, "seed": 1, "guided_regex": "[0-9]{3}"},
])
def test_device_sampler_replies_equal_the_scalar_sampler(tiny_dir, monkeypatch, sampling):
    """A seeded workload (three sessions decoding together, drafts verified) gives the same
    replies with the engine's sampler as with the pre-batching scalar sampler on the host."""
    from worldserve.engines.reasoner import execute

    got = concurrent_replies(_engine(tiny_dir, streaming={"spec_method": "ngram"}), sampling)
    monkeypatch.setattr(execute, "sample_rows", reference_rows)
    expected = concurrent_replies(_engine(tiny_dir, streaming={"spec_method": "ngram"}),
                                  sampling)
    assert got == expected
    assert len({tuple(t) for replies in got.values() for t in replies}) > 3
