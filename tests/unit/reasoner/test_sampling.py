"""The engine's sampler (`engines/reasoner/sampling.py`) against an independent scalar sampler
(`scalar_sampler.py`, the pre-batching implementation with `torch.multinomial`): the same
tokens row by row, and what each knob does (temperature, top-k, top-p, repetition /
frequency / presence penalties, banned tokens) asserted on its own."""

from __future__ import annotations

import pytest
import torch

from tests.unit.reasoner.scalar_sampler import ScalarRow, probabilities, process
from worldserve.engines.reasoner.decoding import ReplyDecoder
from worldserve.engines.reasoner.sampling import (
    NUCLEUS_PRECUT,
    exponential_noise,
    process_rows,
    race,
    sample_rows,
)
from worldserve.ipc.messages import ReasonerSampling

STOP = 1


class _Tokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def _pair(vocab: int, seed: int, context: list[int] | None = None, banned=(), **knobs):
    """The engine's decoder and the scalar reference row with the same settings and seed."""
    context = context or []
    sampling = ReasonerSampling(max_tokens=1000, **knobs)  # unset knobs: the server defaults
    engine = ReplyDecoder(sampling, context, {STOP}, _Tokenizer(), vocab,
                          torch.Generator().manual_seed(seed), banned_ids=tuple(banned))
    knobs = {name: getattr(sampling, name) for name in (
        "temperature", "top_p", "top_k", "repetition_penalty", "frequency_penalty",
        "presence_penalty")}
    return engine, ScalarRow(vocab, context=context, banned=tuple(banned), seed=seed, **knobs)


SETTINGS = [
    dict(temperature=0.0),
    dict(temperature=1.0, top_p=1.0),
    dict(temperature=0.7, top_p=0.9, repetition_penalty=1.3),
    dict(temperature=0.5, top_k=20, frequency_penalty=0.4, presence_penalty=0.2),
    dict(temperature=1.3, top_p=0.5, repetition_penalty=0.9),
    dict(temperature=0.3, top_p=0.9, repetition_penalty=1.1),  # the server default
    dict(temperature=2.0, top_p=0.95),  # flat: the nucleus reaches past the top-k pre-cut
    dict(temperature=1.0, top_k=8, top_p=1.0, repetition_penalty=1.0, frequency_penalty=1.5),
]


@pytest.mark.parametrize("scale", [3.0, 0.05])  # peaked and nearly flat logits
def test_batched_device_sampler_equals_the_scalar_reference(scale):
    """Rows of mixed settings sampled together give each row the scalar sampler's token, step
    after step (per-row generators; penalties updated by every accepted token). A row's logits
    drift around a fixed base, so tokens recur and the penalties change draws."""
    vocab = 300
    gen = torch.Generator().manual_seed(0)
    distinct = set()
    for trial in range(12):
        context = torch.randint(0, vocab, (30,), generator=torch.Generator().manual_seed(trial))
        pairs = [_pair(vocab, trial * 10 + k, context.tolist(), banned=(5, 6), **s)
                 for k, s in enumerate(SETTINGS)]
        base = torch.randn(len(SETTINGS), vocab + 4, generator=gen) * scale
        for _ in range(8):
            logits = base + torch.randn(base.shape, generator=gen) * scale * 0.3
            got = sample_rows([e for e, _ in pairs], logits)
            expected = [ref.sample(row) for (_, ref), row in zip(pairs, logits)]
            assert got == expected
            assert not {5, 6} & set(got)
            for (engine, ref), token in zip(pairs, got):
                engine.accept(token)
                ref.accept(token)
            distinct.update(got)
    assert len(distinct) > 50  # the draws really vary


def test_a_row_samples_the_same_alone_and_in_a_batch():
    pairs = [_pair(200, k, **s) for k, s in enumerate(SETTINGS)]
    alone = [_pair(200, k, **s)[0] for k, s in enumerate(SETTINGS)]
    logits = torch.randn(len(SETTINGS), 200, generator=torch.Generator().manual_seed(3))
    together = sample_rows([e for e, _ in pairs], logits)
    assert together == [sample_rows([d], row[None])[0] for d, row in zip(alone, logits)]


def _frequencies(vocab: int, logits: torch.Tensor, draws: int, **knobs) -> torch.Tensor:
    engine, _ = _pair(vocab, 12, **knobs)
    tokens = [sample_rows([engine], logits[None])[0] for _ in range(draws)]
    return torch.bincount(torch.tensor(tokens), minlength=vocab).float() / draws


def test_temperature_scales_the_softmax():
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -2.0])
    for temperature in (0.5, 2.0):
        got = _frequencies(6, logits, 3000, temperature=temperature, top_p=1.0,
                           repetition_penalty=1.0)
        expected = torch.exp(logits / temperature) / torch.exp(logits / temperature).sum()
        torch.testing.assert_close(got, expected, atol=0.03, rtol=0)
    greedy, _ = _pair(6, 0, temperature=0.0)
    assert sample_rows([greedy], logits[None]) == [0]


def test_top_k_draws_only_the_k_largest():
    logits = torch.randn(50, generator=torch.Generator().manual_seed(1))
    got = _frequencies(50, logits, 2000, temperature=3.0, top_k=5, top_p=1.0,
                       repetition_penalty=1.0)
    top5 = set(torch.topk(logits, 5).indices.tolist())
    assert set(torch.nonzero(got).flatten().tolist()) == top5


@pytest.mark.parametrize("vocab", [10, 4 * NUCLEUS_PRECUT])
def test_top_p_draws_only_the_smallest_set_reaching_p(vocab):
    """Probabilities 0.5, 0.3, then the rest spread thin: top_p 0.75 keeps exactly the two
    largest, in proportion 5:3 (the small vocabulary fits the pre-cut; the large one has its
    nucleus decided from the pre-cut as well, with the rest below it)."""
    probs = torch.full((vocab,), 0.2 / (vocab - 2))
    probs[3], probs[7] = 0.5, 0.3
    got = _frequencies(vocab, probs.log(), 3000, temperature=1.0, top_p=0.75,
                       repetition_penalty=1.0)
    assert set(torch.nonzero(got).flatten().tolist()) == {3, 7}
    assert got[3] / got[7] == pytest.approx(5 / 3, rel=0.12)


def test_top_p_past_the_precut_keeps_the_whole_nucleus():
    """A flat distribution whose nucleus holds far more tokens than the pre-cut: every token
    inside it can be drawn, none outside (the full sort on the device)."""
    vocab = 4 * NUCLEUS_PRECUT
    logits = torch.linspace(0.0, -0.5, vocab)  # token 0 most likely, the last least
    engine, ref = _pair(vocab, 5, temperature=1.0, top_p=0.5, repetition_penalty=1.0)
    probs = probabilities(process(logits, ref, ref.seen, ref.counts, (), None), ref)
    nucleus = int((probs > 0).sum())
    assert NUCLEUS_PRECUT < nucleus < vocab
    tokens = {sample_rows([engine], logits[None])[0] for _ in range(3000)}
    assert max(tokens) == nucleus - 1 and len(tokens) > 0.9 * nucleus


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits():
    engine, _ = _pair(6, 0, context=[0, 1], temperature=1.0, repetition_penalty=2.0)
    engine.accept(2)
    logits = torch.tensor([[4.0, -4.0, 3.0, 4.0, -4.0, 0.5]])
    got = process_rows([engine], logits)[0]
    assert got.tolist() == [2.0, -8.0, 1.5, 4.0, -4.0, 0.5]  # 0, 1 context; 2 replied


def test_frequency_and_presence_penalties_count_reply_tokens_only():
    engine, _ = _pair(5, 0, context=[4], temperature=1.0, repetition_penalty=1.0,
                      frequency_penalty=0.5, presence_penalty=0.25)
    for token in (2, 2, 3):
        engine.accept(token)
    got = process_rows([engine], torch.zeros(1, 5))[0]
    assert got.tolist() == [0.0, 0.0, -1.25, -0.75, 0.0]


def test_banned_tokens_are_never_drawn():
    logits = torch.zeros(1, 8)
    logits[0, 3] = 50.0
    engine, _ = _pair(8, 0, banned=(3,), temperature=0.0)
    assert sample_rows([engine], logits) != [3]
    engine, _ = _pair(8, 0, banned=(3,), temperature=5.0, top_p=1.0)
    assert 3 not in {sample_rows([engine], logits)[0] for _ in range(200)}


def test_draw_equals_torch_multinomial():
    """The batched draw is torch.multinomial's exponential race: same tokens for the same
    seeds, generators left in the same state."""
    for trial in range(50):
        probs = torch.softmax(torch.randn(3, 700) * 3, dim=-1)
        probs[:, torch.randint(0, 700, (200,))] = 0.0
        ours = [torch.Generator().manual_seed(trial * 3 + b) for b in range(3)]
        torch_s = [torch.Generator().manual_seed(trial * 3 + b) for b in range(3)]
        for _ in range(3):
            expected = [int(torch.multinomial(row, 1, generator=g))
                        for row, g in zip(probs, torch_s)]
            assert race(probs, exponential_noise(probs, ours)).tolist() == expected
        assert all(torch.equal(a.get_state(), b.get_state()) for a, b in zip(ours, torch_s))


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_a_row_with_every_token_masked_raises(top_p):
    engine, _ = _pair(4, 0, temperature=1.0, top_p=top_p)
    with pytest.raises(ValueError, match="every token is masked"):
        sample_rows([engine], torch.full((1, 4), float("-inf")))
