"""Cosmos3 reasoners (Omni and Edge) on the session engine: the session cache equals
independent recomputation through evictions and re-prefill, session decoding equals
`model.generate`, n-gram speculation stays lossless, and the loader handles what a real
Cosmos3 directory throws at it (no processor_config.json, FP8 shards)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from transformers import AutoProcessor

from tests.unit.reasoner.conftest import GREEDY
from tests.unit.reasoner.drive import windowed_greedy_replies
from tests.unit.reasoner.reference import MaskedReference, full_recompute_check, reply_tokens
from tests.unit.reasoner.tiny_vlm import frame_bytes
from worldserve.models import registry
from worldserve.models.types import ModelLoadError


def test_detected_as_the_cosmos3_reasoner_family(cosmos3_dir):
    assert registry.resolve("reasoner", cosmos3_dir).name == "cosmos3_reasoner"
    with pytest.raises(ModelLoadError, match="cosmos3_"):
        registry.resolve("generation", cosmos3_dir)


def test_session_equals_masked_reference_across_evictions(make_engine, cosmos3_dir):
    drv = make_engine(cosmos3_dir)
    drv.create(retention={"max_video_segments": 2, "max_text_tokens": 12},
               sampling={"max_tokens": 5, **GREEDY})
    session = drv.engine.sessions["s1"]
    ref = MaskedReference(drv.engine.model)
    evicted = 0
    for i in range(6):
        evicted += drv.frame("s1", frame_bytes(i, size=64 + 32 * (i % 2))).evicted_segments
        ref.follow(session)
    assert evicted >= 4 and not all(ref.alive)
    assert len(session.kv) < session.kv.next_pos  # gaps left by eviction


def test_reprefill_equals_a_fresh_prompt(make_engine, cosmos3_dir):
    drv = make_engine(cosmos3_dir)
    drv.create(retention={"max_video_segments": 2, "reprefill_threshold": 0.3,
                          "max_session_tokens": 1024},
               sampling={"max_tokens": 24, **GREEDY})
    session = drv.engine.sessions["s1"]
    reprefills = 0
    for i in range(40):  # ~45 positions a frame (an image takes 7); re-prefill past 0.3 x 4096
        if drv.frame("s1", frame_bytes(i, size=224)).reprefill_ms is not None:
            reprefills += 1
            full_recompute_check(drv.engine.model, session)
    assert reprefills >= 1


def test_greedy_session_reply_equals_model_generate(make_engine, cosmos3_dir):
    drv = make_engine(cosmos3_dir)
    drv.create(sampling={"max_tokens": 12, **GREEDY})
    drv.frame("s1", frame_bytes(0, size=96))
    session = drv.engine.sessions["s1"]
    reply = reply_tokens(session)
    prompt = session.kv.ids[: len(session.kv.ids) - (len(reply) - 1)]
    image = next(s.image for s in session.segments if s.image is not None)
    model = drv.engine.model
    input_ids = torch.tensor([prompt])
    banned = [[t] for t in drv.engine.prompts.placeholder_ids]  # the engine never samples them
    out = model.generate(
        input_ids=input_ids, pixel_values=image.payload.pixel_values,
        image_grid_thw=image.payload.grid_thw,
        mm_token_type_ids=(input_ids == model.config.image_token_id).long(),
        max_new_tokens=len(reply), do_sample=False, bad_words_ids=banned)
    assert out[0, len(prompt):].tolist() == reply


def test_ngram_speculation_is_lossless(make_engine, cosmos3_dir):
    spec = make_engine(cosmos3_dir, spec_method="ngram", spec_num_tokens=3)
    assert windowed_greedy_replies(spec) == windowed_greedy_replies(make_engine(cosmos3_dir))


def test_loader_builds_an_image_processor_where_autoprocessor_gives_a_tokenizer(cosmos3_dir):
    from worldserve.models.cosmos3_reasoner.loader import load_runner

    runner = load_runner(cosmos3_dir)
    assert runner.image_processor is not None
    assert runner.prompting.image_token_id == runner.model.config.image_token_id
    if json.loads((cosmos3_dir / "config.json").read_text())["model_type"] == "cosmos3_omni":
        # what the loader guards against: no processor entry for cosmos3_omni
        bare = AutoProcessor.from_pretrained(cosmos3_dir, local_files_only=True)
        assert getattr(bare, "image_processor", None) is None


def test_quantisation_config_over_plain_weights_is_a_clear_load_error(cosmos3_dir, tmp_path):
    from worldserve.models.cosmos3_reasoner.loader import load_runner

    quantised = tmp_path / "fp8"
    shutil.copytree(cosmos3_dir, quantised)
    config = json.loads((quantised / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "FP8"}
    (quantised / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="says the weights are quantised, but no FP8"):
        load_runner(quantised, device="cpu")
