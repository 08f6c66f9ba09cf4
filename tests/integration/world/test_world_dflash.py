"""DFlash on the world reasoner (issue 30, item 2): the drafter trained against it
(`<dev-models>/world-drafter`, shipped weights) has its drafts accepted on held-out clips, and
every reply stays plain decoding's. The reasoner engine runs in-process, as the reasoner stage
runs it, on chat completions with the clip as a video part (benchmarks/dflash_world.py's
workload, at 3 clips). A random drafter of the same shape is accepted about never (mean
acceptance length ~1.0, benchmarks/README.md), so it fails the acceptance bar here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.dflash_world import MAX_TOKENS, Arm, world_questions

NUM_CLIPS = 3  # held-out seeds 0..2, each asked the 5 grammar questions


@pytest.fixture(scope="module")
def questions() -> list:
    return world_questions(NUM_CLIPS)


@pytest.fixture(scope="module")
def plain(dev_models_dir: Path, questions: list) -> dict:
    return Arm("plain", dev_models_dir / "world", None).answer(questions, MAX_TOKENS)


def acceptance_length(run: dict, plain: dict, num_requests: int) -> float:
    """Tokens per target decode forward. Plain decoding runs one forward per token after each
    reply's first, so its other forwards are the prefills, which speculation leaves alone."""
    decoded = plain["tokens"] - num_requests
    prefills = plain["forwards"] - decoded
    return decoded / (run["forwards"] - prefills)


def test_the_trained_world_drafter_is_accepted_and_lossless(dev_models_dir: Path,
                                                             questions: list,
                                                             plain: dict) -> None:
    run = Arm("dflash", dev_models_dir / "world",
              dev_models_dir / "world-drafter").answer(questions, MAX_TOKENS)
    assert run["replies"] == plain["replies"]
    assert run["tokens"] == plain["tokens"]
    assert acceptance_length(run, plain, len(questions)) > 1.5
