"""Decoding: speculation is lossless, guided replies follow their grammar, stop strings."""

from __future__ import annotations

import json
import re

import pytest

from tests.unit.reasoner.conftest import GREEDY
from tests.unit.reasoner.reference import reply_tokens
from tests.unit.reasoner.tiny_vlm import frame_bytes
from worldserve.engines.reasoner.decoding import NgramProposer
from worldserve.errors import InvalidRequest


def _session_replies(drv, sampling, num_frames=8, retention=None):
    drv.create(retention=retention or {"max_video_segments": 2}, sampling=sampling)
    session = drv.engine.sessions["s1"]
    out = []
    for i in range(num_frames):
        result = drv.frame("s1", frame_bytes(i))
        out.append((reply_tokens(session), result.text, result.finish_reason))
    return out


@pytest.mark.parametrize("sampling", [
    {"max_tokens": 24, **GREEDY},
    {"max_tokens": 24, "temperature": 0.8, "top_p": 0.9, "top_k": 50, "seed": 7,
     "repetition_penalty": 1.1, "frequency_penalty": 0.3, "presence_penalty": 0.2},
])
def test_ngram_speculation_is_lossless(make_engine, sampling):
    plain = make_engine(spec_method="none")
    spec = make_engine(spec_method="ngram", spec_num_tokens=4)
    expected = _session_replies(plain, sampling)
    got = _session_replies(spec, sampling)
    assert got == expected
    # drafts were accepted: fewer forwards for the same tokens
    assert spec.engine.runner.num_forwards < plain.engine.runner.num_forwards
    extra = spec.engine.stats()["extra"]
    assert 0 < extra["spec_accepted"] <= extra["spec_drafted"]


def test_seeded_sampling_is_reproducible_and_seed_dependent(make_engine):
    sampling = {"max_tokens": 16, "temperature": 1.5, "top_p": 1.0, "seed": 3}
    first = _session_replies(make_engine(), sampling, num_frames=3)
    again = _session_replies(make_engine(), sampling, num_frames=3)
    other = _session_replies(make_engine(), {**sampling, "seed": 4}, num_frames=3)
    assert first == again
    assert first != other


def test_ngram_proposer_drafts_continuation_of_latest_match():
    proposer = NgramProposer(num_tokens=3)
    assert proposer.propose([1, 2, 3, 4, 5, 9, 1, 2, 3], limit=10) == [4, 5, 9]
    assert proposer.propose([7, 8, 9], limit=10) == []
    assert proposer.propose([1, 2, 3, 4, 5, 9, 1, 2, 3], limit=2) == [4, 5]


def test_guided_choice_every_reply_is_a_choice(make_engine):
    drv = make_engine(spec_method="ngram")
    replies = _session_replies(drv, {"max_tokens": 24, "guided_choice": ["clear", "hazard"],
                                     "temperature": 0.7, "seed": 1})
    for _, text, finish in replies:
        assert text in ("clear", "hazard") and finish == "stop"


def test_guided_regex_and_json(make_engine):
    drv = make_engine()
    for _, text, finish in _session_replies(drv, {"max_tokens": 24, "guided_regex": "[0-9]{2}",
                                                  "temperature": 1.0, "seed": 2}, num_frames=3):
        assert re.fullmatch("[0-9]{2}", text) and finish == "stop"
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                     "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    drv = make_engine()
    replies = _session_replies(drv, {"max_tokens": 24, "guided_json": json.dumps(schema),
                                     "temperature": 1.0, "seed": 5}, num_frames=3)
    for _, text, finish in replies:
        assert finish == "stop"
        value = json.loads(text)
        assert set(value) == {"n"} and 0 <= value["n"] <= 9


@pytest.mark.parametrize("sampling, message", [
    ({"guided_choice": ["a"], "guided_regex": "a"}, "at most one of guided_json"),
    ({"guided_regex": "(unclosed"}, "guided_regex cannot be compiled"),
    ({"guided_json": "{not json"}, "guided_json is not valid JSON"),
    ({"guided_json": json.dumps({"type": "wat"})}, "guided_json"),
])
def test_invalid_grammar_is_refused_at_creation(make_engine, sampling, message):
    drv = make_engine()
    with pytest.raises(InvalidRequest, match=message):
        drv.create(sampling=sampling)
    assert drv.engine.sessions == {}


def test_stop_string_ends_reply_and_is_not_in_text(make_engine):
    drv = make_engine()
    sampling = {"max_tokens": 24, "guided_regex": "ab(cd)+", "temperature": 1.0, "seed": 0}
    replies = _session_replies(drv, {**sampling, "stop": ["cd"]}, num_frames=2)
    for _, text, finish in replies:
        assert text == "ab" and finish == "stop"


def test_vision_placeholders_are_never_sampled(make_engine):
    import torch

    from worldserve.engines.reasoner.sampling import sample_rows
    from worldserve.ipc.messages import ReasonerSampling

    engine = make_engine().engine
    prompting = engine.runner.prompting
    assert {prompting.image_token_id, prompting.video_token_id} <= set(engine.ctx.banned_ids)
    for pad in (prompting.image_token_id, prompting.video_token_id):
        logits = torch.zeros(engine.runner.vocab_size)
        logits[pad] = 100.0
        decoder = engine.ctx.decoder(ReasonerSampling(temperature=0.0), [], torch.Generator(),
                                     None)
        assert sample_rows([decoder], logits[None]) != [pad]
