"""When a reply may end: `min_tokens` masks end of turn (and holds stop strings back) until the
reply is that long, `ignore_eos` never ends it on end of turn (vLLM's two sampling fields), each
asked exactly at its boundary."""

from __future__ import annotations

import msgspec
import pytest
import torch

from worldserve.engines.reasoner.admission import fit_max_tokens
from worldserve.engines.reasoner.decoding import ReplyDecoder
from worldserve.engines.reasoner.sampling import sample_rows
from worldserve.ipc.messages import ChatCompletion, ReasonerSampling

STOP, VOCAB = 1, 8


class _Tokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def _decoder(**knobs) -> ReplyDecoder:
    sampling = ReasonerSampling(**{"max_tokens": 10, "temperature": 0.0, **knobs})
    return ReplyDecoder(sampling, [], {STOP}, _Tokenizer(), VOCAB, torch.Generator())


def _reply(decoder: ReplyDecoder, logits: torch.Tensor) -> list[int]:
    """Sample and accept until the reply ends; the same logits every step."""
    while decoder.finish_reason is None:
        decoder.accept(sample_rows([decoder], logits[None])[0])
    return decoder.tokens


def _eos_first() -> torch.Tensor:
    """End of turn the most likely token, 5 the next."""
    logits = torch.zeros(VOCAB)
    logits[STOP], logits[5] = 9.0, 4.0
    return logits


@pytest.mark.parametrize("min_tokens", [0, 1, 3, 10])
def test_min_tokens_masks_end_of_turn_until_the_reply_holds_that_many(min_tokens):
    decoder = _decoder(min_tokens=min_tokens)
    tokens = _reply(decoder, _eos_first())
    if min_tokens == 10:  # the whole budget: end of turn never had a turn
        assert tokens == [5] * 10 and decoder.finish_reason == "length"
    else:
        assert tokens == [5] * min_tokens + [STOP] and decoder.finish_reason == "stop"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_min_tokens_masks_end_of_turn_for_sampled_rows_too(temperature):
    logits = torch.zeros(VOCAB)
    logits[STOP] = 30.0  # a sampled row would draw end of turn every time
    decoder = _decoder(min_tokens=4, temperature=temperature, top_p=1.0, seed=0)
    tokens = _reply(decoder, logits)
    assert len(tokens) == 5 and STOP not in tokens[:4] and tokens[4] == STOP


class _FivesGuide:
    """The grammar "5+" (llguidance's matcher stands behind the same four calls)."""

    def __init__(self) -> None:
        self.consumed: list[int] = []

    def allowed(self) -> torch.Tensor:
        return torch.arange(VOCAB) == 5

    def consume(self, token: int) -> None:
        assert token == 5
        self.consumed.append(token)

    def is_accepting(self) -> bool:
        return bool(self.consumed)

    def is_complete(self) -> bool:
        return False


@pytest.mark.parametrize("min_tokens, expected", [(0, [5, STOP]), (3, [5, 5, 5, STOP])])
def test_min_tokens_holds_under_a_grammar_that_already_accepts(min_tokens, expected):
    """"5+" accepts after one 5: end of turn waits for min_tokens all the same."""
    sampling = ReasonerSampling(max_tokens=10, temperature=0.0, min_tokens=min_tokens)
    decoder = ReplyDecoder(sampling, [], {STOP}, _Tokenizer(), VOCAB, torch.Generator(),
                           guide=_FivesGuide())
    assert _reply(decoder, _eos_first()) == expected and decoder.finish_reason == "stop"


def test_ignore_eos_runs_to_max_tokens_and_keeps_end_of_turn_out_of_the_text():
    decoder = _decoder(ignore_eos=True, max_tokens=6)
    tokens = _reply(decoder, _eos_first())
    assert tokens == [STOP] * 6 and decoder.finish_reason == "length"
    assert decoder.text == ""
    decoder = _decoder(ignore_eos=True, max_tokens=4)
    for token in (3, STOP, 4):
        assert decoder.accept(token) is None
    assert decoder.accept(STOP) == "length" and decoder.text == "3 4"


def test_ignore_eos_leaves_stop_strings_in_force():
    decoder = _decoder(ignore_eos=True, stop=["4"])
    for token in (3, STOP, 2):
        assert decoder.accept(token) is None
    assert decoder.accept(4) == "stop" and decoder.text == "3 2 "


def test_a_stop_string_ends_a_reply_only_where_it_ends_past_min_tokens():
    # "7" inside the first three tokens is passed over; the next one ends the reply
    decoder = _decoder(min_tokens=3, stop=["7"])
    for token in (7, 2, 3):
        assert decoder.accept(token) is None
    assert decoder.accept(7) == "stop" and decoder.text == "7 2 3 "
    # at the boundary: the min_tokens-th token is the first whose stop string counts
    decoder = _decoder(min_tokens=2, stop=["3 7"])
    assert decoder.accept(3) is None
    assert decoder.accept(7) == "stop" and decoder.text == ""
    decoder = _decoder(min_tokens=3, stop=["3 7"])
    for token in (3, 7, 3):  # "3 7" ended at the second token
        assert decoder.accept(token) is None
    assert decoder.accept(7) == "stop" and decoder.text == "3 7 "
    # without min_tokens the first occurrence ends it, as before
    decoder = _decoder(stop=["7"])
    assert decoder.accept(7) == "stop" and decoder.text == ""


def test_an_empty_stop_string_ends_nothing():
    decoder = _decoder(stop=[""], max_tokens=2)
    assert decoder.accept(3) is None and decoder.accept(4) == "length"


def test_lowering_max_tokens_to_the_room_left_lowers_min_tokens_with_it():
    request = ChatCompletion(request_id="r", messages=[],
                             sampling=ReasonerSampling(max_tokens=50, min_tokens=40))
    fitted = fit_max_tokens(request, prompt_tokens=70, max_model_len=100)
    assert (fitted.sampling.max_tokens, fitted.sampling.min_tokens) == (30, 30)
    fitted = fit_max_tokens(request, prompt_tokens=45, max_model_len=100)
    assert (fitted.sampling.max_tokens, fitted.sampling.min_tokens) == (50, 40)
    kept = msgspec.structs.replace(request.sampling, min_tokens=20)
    fitted = fit_max_tokens(msgspec.structs.replace(request, sampling=kept), 70, 100)
    assert (fitted.sampling.max_tokens, fitted.sampling.min_tokens) == (30, 20)
