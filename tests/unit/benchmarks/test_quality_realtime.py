"""The realtime arm of benchmarks/quality.py scores a received chunk by the world's evaluator:
frames the world itself draws under the held key read as a response, other keys do not."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.quality import chunk_keys, score_chunk
from worldserve.models.dev.world.scenes import agent_clip

SEEDS = range(8)


def test_the_held_key_flips_to_its_opposite_every_chunk() -> None:
    assert chunk_keys("d", 3) == ["d", "a", "d"]
    assert chunk_keys("w", 4) == ["w", "s", "w", "s"]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("key, wrong", [("d", "a"), ("a", "d"), ("w", "s"), ("s", "w")])
def test_a_first_chunk_drawn_by_the_world_responds_to_its_key_only(seed, key, wrong) -> None:
    clip = agent_clip(seed, [[key]] * 8)  # 9 frames, like the dev model's first chunk
    colour = clip.scene.colour
    assert score_chunk(None, clip.frames, key, colour) == (True, True)
    assert score_chunk(None, clip.frames, wrong, colour) == (False, True)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_later_chunk_is_read_from_the_previous_chunks_last_frame(seed) -> None:
    clip = agent_clip(seed, [["d"]] * 8 + [["a"]] * 12)  # chunks of 9 and 12 frames
    first, second = clip.frames[:9], clip.frames[9:]
    assert score_chunk(first[-1], second, "a", clip.scene.colour)[0]
    assert not score_chunk(first[-1], second, "d", clip.scene.colour)[0]


@pytest.mark.parametrize("seed", SEEDS)
def test_the_step_into_a_later_chunk_counts(seed) -> None:
    scene = agent_clip(seed, []).scene
    # Toward the far side: >= 18 px of room (the agent starts in the middle half of its room).
    key = "d" if scene.start_px[0] <= (64 - scene.side_px) / 2 else "a"
    moved = agent_clip(seed, [[key]] * 3).frames  # the key's first 3 steps (9 px)...
    rest = np.repeat(moved[-1:], 4, axis=0)  # ...then a chunk that shows the agent at rest
    assert score_chunk(moved[0], rest, key, scene.colour)[0]
    assert not score_chunk(None, rest, key, scene.colour)[0]


def test_an_agent_that_ignores_the_key_or_changes_colour_scores_nothing() -> None:
    still = agent_clip(3, [[]] * 8)
    other = next(c for c in ("red", "green", "blue", "yellow") if c != still.scene.colour)
    assert score_chunk(None, still.frames, "d", still.scene.colour) == (False, True)
    assert score_chunk(None, agent_clip(3, [["d"]] * 8).frames, "d", other) == (True, False)
    blank = np.zeros_like(still.frames)  # no agent on screen at all
    assert score_chunk(None, blank, "d", still.scene.colour) == (False, False)


def test_a_frame_filling_blob_is_no_response() -> None:
    """A random model's grey noise reads as one blob the size of the frame: the world's roll-out
    cannot move it (an edge stop, 'still') and neither does the model, yet it is no response."""
    noise = np.random.default_rng(0).normal(124, 20, (9, 64, 64, 3)).clip(0, 255)
    assert not score_chunk(None, noise.astype(np.uint8), "d", "blue")[0]
