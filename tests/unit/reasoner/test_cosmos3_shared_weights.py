"""One Cosmos3 directory, both stages: the reasoner's LLM tensors are the generator
transformer's understanding pathway, and tying them in one process leaves logits unchanged
while holding one copy.

The generator here is a bare tiny `Cosmos3OmniTransformer` in the diffusers layout
(`model_index.json` + `transformer/`); the full dev pipeline is the Cosmos3 generation
family's builder, which calls `write_reasoner_files` the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from diffusers.models.transformers.transformer_cosmos3 import Cosmos3OmniTransformer

from tests.unit.reasoner.tiny_vlm import frame_bytes
from worldserve.models import registry
from worldserve.models.cosmos3_reasoner.dev import write_generator_transformer, write_reasoner_files
from worldserve.models.cosmos3_reasoner.sharing import (
    WeightMismatch,
    tie_text_pathway,
    unique_parameter_bytes,
)
from worldserve.models.cosmos3_reasoner.text_pathway import shared_pairs


def build_generator(target: Path, model_type: str) -> Cosmos3OmniTransformer:
    return write_generator_transformer(target, 1, model_type)


@pytest.fixture(scope="module", params=["cosmos3_omni", "cosmos3_edge"])
def one_dir(request, tmp_path_factory):
    target = tmp_path_factory.mktemp(f"one-{request.param}")
    build_generator(target, request.param)
    write_reasoner_files(target, 0, request.param)
    return target, request.param


def test_both_stages_resolve_from_one_directory(one_dir):
    target, _ = one_dir
    assert registry.stage_kinds(target)[-1] == "reasoner"
    assert registry.resolve("reasoner", target).name == "cosmos3_reasoner"


def transformers_reference(target: Path, model_type: str, scratch: Path) -> Any:
    """The reasoner as transformers itself loads a unified Cosmos3 checkpoint: the generator's
    own `transformer/` tensors through `from_pretrained`, whose load-time renaming
    (conversion_mapping.py, "cosmos3_omni" / "cosmos3_edge") turns diffusers names into the
    reasoner's. No worldserve code maps a name here (`reasoner_key` is what is checked)."""
    from transformers import (
        Cosmos3EdgeForConditionalGeneration,
        Cosmos3OmniForConditionalGeneration,
    )

    view = scratch / "transformers-view"
    view.mkdir()
    (view / "config.json").write_bytes((target / "config.json").read_bytes())
    (view / "model.safetensors").symlink_to(
        target / "transformer" / "diffusion_pytorch_model.safetensors")
    model_class = {"cosmos3_omni": Cosmos3OmniForConditionalGeneration,
                   "cosmos3_edge": Cosmos3EdgeForConditionalGeneration}[model_type]
    return model_class.from_pretrained(view).eval()


def test_reasoner_llm_tensors_equal_transformers_own_renaming(one_dir, tmp_path):
    target, model_type = one_dir
    reference = transformers_reference(target, model_type, tmp_path)
    text = {name: p for name, p in reference.named_parameters()
            if name.startswith("model.language_model.") or name == "lm_head.weight"}
    # embed_tokens, norm, lm_head + per layer: q/k/v/o, q/k norms (Omni), the MLP (gate/up/down
    # on Omni, fc1/fc2 on Edge), the two layer norms
    per_layer = {"cosmos3_omni": 4 + 2 + 3 + 2, "cosmos3_edge": 4 + 2 + 2}[model_type]
    assert len(text) == 3 + 2 * per_layer
    # distinct weights (norms too: the dev builder spreads them), so no two tensors of one
    # shape can be swapped unseen
    for name, tensor in text.items():
        assert not any(torch.equal(tensor, other) for other_name, other in text.items()
                       if other_name != name and other.shape == tensor.shape), name
    generator = Cosmos3OmniTransformer.from_pretrained(target / "transformer").eval()
    for runner in (registry.load_runner("reasoner", target),
                   registry.load_runner("reasoner", target, generator=generator)):
        loaded = dict(runner.model.named_parameters(remove_duplicate=False))
        for name, tensor in text.items():
            assert torch.equal(loaded[name], tensor), name


def test_tied_reasoner_shares_storage_and_keeps_its_logits(one_dir, make_engine):
    target, model_type = one_dir
    generator = Cosmos3OmniTransformer.from_pretrained(target / "transformer").eval()
    alone = registry.load_runner("reasoner", target)
    tied = registry.load_runner("reasoner", target, generator=generator)
    separate = unique_parameter_bytes(generator) + unique_parameter_bytes(alone.model)
    shared = unique_parameter_bytes(generator, tied.model)
    llm_bytes = sum(p.numel() * p.element_size()
                    for _, name in shared_pairs(generator, tied.model, model_type)
                    for p in [dict(tied.model.named_parameters())[name]])
    assert separate - shared == llm_bytes
    tied_params = {p.data_ptr() for p in tied.model.parameters()}
    assert all(p.data_ptr() in tied_params for n, p in generator.named_parameters()
               if n == "embed_tokens.weight" or n.endswith("self_attn.to_q.weight"))
    # same replies, same logits, from the engine over either runner
    prompts = make_engine(target).engine.prompts
    chunk = prompts.frame_chunk(frame_bytes(0, size=96), "Describe.", "What?", None, set())
    logits = [r.forward(r.new_kv(), chunk.turn_ids, [chunk.image], num_logits=4)
              for r in (alone, tied)]
    assert torch.equal(logits[0], logits[1])


def test_tying_refuses_a_generator_that_differs(one_dir, tmp_path):
    target, model_type = one_dir
    other = build_generator(tmp_path, model_type)
    with torch.no_grad():
        other.norm.weight.add_(1.0)
    runner = registry.load_runner("reasoner", target)
    with pytest.raises(WeightMismatch, match="norm"):
        tie_text_pathway(runner.model, other, model_type)


def test_colocated_loader_ties_to_the_published_generator(one_dir):
    """In a colocated stage process the generation loader publishes its transformer; the
    reasoner loader of the same directory finds it and shares the LLM tensors."""
    from worldserve.levers import shared

    target, _ = one_dir
    generator = Cosmos3OmniTransformer.from_pretrained(target / "transformer").eval()
    shared.publish(target, shared.GENERATOR_TRANSFORMER, generator)
    try:
        tied = registry.load_runner("reasoner", target)
    finally:
        shared.withdraw(target, shared.GENERATOR_TRANSFORMER)
    alone = registry.load_runner("reasoner", target)
    embed = generator.embed_tokens.weight
    assert tied.model.get_input_embeddings().weight is embed
    assert alone.model.get_input_embeddings().weight is not embed


def test_tying_refuses_another_dtype(one_dir):
    target, model_type = one_dir
    generator = Cosmos3OmniTransformer.from_pretrained(target / "transformer").eval()
    runner = registry.load_runner("reasoner", target)
    with pytest.raises(WeightMismatch, match="one dtype on one device"):
        tie_text_pathway(runner.model, generator.to(torch.bfloat16), model_type)


def test_cosmos3_dev_directory_serves_both_and_shares_in_one_process(tmp_path):
    """The dev Cosmos3 generation directory holds its reasoner; loading the generation runner
    then the reasoner runner in one process (a colocated stage) leaves one copy of the LLM."""
    from worldserve.levers import shared
    from worldserve.models.cosmos3.dev import build_generation

    build_generation(tmp_path, 0)
    assert registry.stage_kinds(tmp_path) == ["generation", "reasoner"]
    generation = registry.load_runner("generation", tmp_path)
    try:
        reasoner = registry.load_runner("reasoner", tmp_path)
    finally:
        shared.withdraw(tmp_path, shared.GENERATOR_TRANSFORMER)
    transformer = generation.pipe.transformer
    assert reasoner.model.get_input_embeddings().weight is transformer.embed_tokens.weight
    assert reasoner.model.lm_head.weight is transformer.lm_head.weight
