"""DFlash on the world reasoner (issue 30, item 2): the drafter trained against it
(`<dev-models>/world-drafter`, shipped weights) has its drafts accepted on held-out clips, and
every reply stays plain decoding's. The reasoner engine runs in-process, as the reasoner stage
runs it, on chat completions with the clip as a video part and on a live session over a stream
clip (benchmarks/dflash_world.py's workloads, at 3 clips and 1 session). A random drafter of the
same shape is accepted about never (mean acceptance length ~1.0, benchmarks/README.md), so it
fails the acceptance bars here.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from benchmarks.dflash_world import MAX_TOKENS, Arm, greedy, world_questions, world_streams

NUM_CLIPS = 3  # held-out seeds 0..2, each asked the 5 grammar questions


@pytest.fixture(scope="module")
def questions() -> list:
    return world_questions(NUM_CLIPS)


@pytest.fixture(scope="module")
def arms(dev_models_dir: Path) -> tuple[Arm, Arm]:
    world = dev_models_dir / "world"
    return Arm("plain", world, None), Arm("dflash", world, dev_models_dir / "world-drafter")


def acceptance_length(run: dict, plain: dict, num_requests: int) -> float:
    """Tokens per target decode forward. Plain decoding runs one forward per token after each
    reply's first, so its other forwards are the prefills, which speculation leaves alone."""
    decoded = plain["tokens"] - num_requests
    prefills = plain["forwards"] - decoded
    return decoded / (run["forwards"] - prefills)


def test_the_trained_world_drafter_is_accepted_and_lossless(arms: tuple[Arm, Arm],
                                                             questions: list) -> None:
    plain, run = (arm.answer(questions, greedy(MAX_TOKENS)) for arm in arms)
    assert run["replies"] == plain["replies"]
    assert run["tokens"] == plain["tokens"]
    assert acceptance_length(run, plain, len(questions)) > 1.5


def test_a_live_session_with_the_trained_drafter_is_accepted_and_lossless(
        arms: tuple[Arm, Arm]) -> None:
    streams = world_streams(1)  # 9 frames, a reply each (a colour word: 2 tokens and the end)
    plain, run = (arm.watch(streams, greedy(MAX_TOKENS)) for arm in arms)
    assert run["replies"] == plain["replies"]
    assert run["tokens"] == plain["tokens"]
    assert acceptance_length(run, plain, len(plain["replies"])) > 1.5


def test_min_tokens_and_ignore_eos_run_on_past_the_answer_and_stay_lossless(
        arms: tuple[Arm, Arm], questions: list) -> None:
    """The world reasoner ends its answers after a word or two; `min_tokens` holds its end of
    turn back and `ignore_eos` never lets it end, with the drafter as without."""
    asked = questions[:5]  # one clip's five questions
    natural = arms[0].answer(asked, greedy(MAX_TOKENS))
    assert natural["tokens"] < 8 * len(asked)  # it does end early by itself
    held = msgspec.structs.replace(greedy(MAX_TOKENS), min_tokens=8)
    endless = msgspec.structs.replace(greedy(MAX_TOKENS), ignore_eos=True)
    for sampling, least in ((held, 8), (endless, MAX_TOKENS)):
        plain, run = (arm.answer(asked, sampling) for arm in arms)
        assert run["replies"] == plain["replies"]
        assert run["tokens"] == plain["tokens"] >= least * len(asked)
        for reply, answer in zip(plain["replies"], natural["replies"]):
            assert reply.startswith(answer), (reply, answer)  # the same greedy answer first
    assert plain["tokens"] == MAX_TOKENS * len(asked)
