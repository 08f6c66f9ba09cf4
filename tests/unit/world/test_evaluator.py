"""The dev world's evaluator reads its own generator's labels back (>= 99 % on >= 100 seeded
clips per capability) and refuses wrong ones (a mirrored clip is read mirrored, a wrong tone is
named wrong, opposite keys are not a response)."""

from __future__ import annotations

import numpy as np
import pytest

from worldserve.models.dev.world import evaluate
from worldserve.models.dev.world.grammar import QUESTIONS, answer, describe
from worldserve.models.dev.world.render import sound_track
from worldserve.models.dev.world.scenes import WorldConfig, agent_clip, make_clip
from worldserve.models.dev.world.vocab import COLOURS, OPPOSITE_KEYS, TONES_HZ

NUM_SEEDS = 100
MIN_ACCURACY = 0.99
CFG = WorldConfig()
MIRRORED = {"left": "right", "right": "left", "up": "up", "down": "down", "still": "still"}


@pytest.fixture(scope="module")
def motion_clips():
    return [make_clip(seed, "motion") for seed in range(NUM_SEEDS)]


@pytest.fixture(scope="module")
def motion_readings(motion_clips):
    return [evaluate.read_clip(clip.frames) for clip in motion_clips]


@pytest.fixture(scope="module")
def agent_clips():
    return [make_clip(seed, "agent") for seed in range(NUM_SEEDS)]


def accuracy(hits: list[bool]) -> float:
    return sum(hits) / len(hits)


@pytest.mark.parametrize("label", ["colour", "shape", "background", "direction"])
def test_reads_the_labels_of_motion_clips(motion_clips, motion_readings, label):
    hits = [getattr(r, label) == getattr(c.scene, label)
            for c, r in zip(motion_clips, motion_readings, strict=True)]
    assert accuracy(hits) >= MIN_ACCURACY, f"{label}: {accuracy(hits):.3f}"


def test_reads_images_too():
    clips = [make_clip(seed, "image") for seed in range(NUM_SEEDS)]
    readings = [evaluate.read_frame(c.frames[0]) for c in clips]
    hits = [(r.colour, r.shape, r.background) == (c.scene.colour, c.scene.shape, c.scene.background)
            for c, r in zip(clips, readings, strict=True)]
    assert accuracy(hits) >= MIN_ACCURACY


def test_every_direction_and_shape_is_drawn(motion_clips):
    assert {c.scene.direction for c in motion_clips} == set(MIRRORED)
    assert {c.scene.shape for c in motion_clips} == {"square", "circle", "triangle"}


def test_a_mirrored_clip_reads_mirrored(motion_clips, motion_readings):
    """A left-moving clip flipped left-right is called right, never left (and the reverse)."""
    for clip, reading in zip(motion_clips, motion_readings, strict=True):
        mirrored = evaluate.read_clip(clip.frames[:, :, ::-1])
        assert mirrored.direction == MIRRORED[reading.direction], clip.scene


def test_a_reversed_clip_reads_the_opposite_way(motion_clips):
    opposite = {"left": "right", "right": "left", "up": "down", "down": "up", "still": "still"}
    for clip in motion_clips[:30]:
        assert evaluate.read_clip(clip.frames[::-1]).direction == opposite[clip.scene.direction]


def test_reads_the_tone_of_every_clip(motion_clips, agent_clips):
    clips = motion_clips + agent_clips
    hits = [evaluate.dominant_tone(c.sound, c.sample_rate_hz)[0] == c.scene.colour for c in clips]
    assert accuracy(hits) >= MIN_ACCURACY


@pytest.mark.parametrize("colour", list(COLOURS))
def test_a_wrong_tone_is_named_as_itself(colour):
    sound = sound_track([colour] * CFG.num_frames, [], CFG.fps, CFG.sample_rate_hz)
    named, peak_hz = evaluate.dominant_tone(sound, CFG.sample_rate_hz)
    assert named == colour and abs(peak_hz - TONES_HZ[colour]) < 5.0


def test_action_response_on_agent_clips(agent_clips):
    hits = [evaluate.action_response(c.frames, c.keys_per_step, CFG.step_px) for c in agent_clips]
    assert accuracy(hits) >= MIN_ACCURACY
    moved = {evaluate.read_clip(c.frames).direction for c in agent_clips}
    assert moved == {"left", "right", "up", "down", "still"}


def test_opposite_keys_are_not_a_response(agent_clips):
    """The clip moved by `d` does not answer `a`: every clip that moved fails with the keys
    swapped for their opposites."""
    moving = [c for c in agent_clips if evaluate.read_clip(c.frames).direction != "still"]
    assert len(moving) >= NUM_SEEDS // 2
    for clip in moving:
        swapped = [[OPPOSITE_KEYS[k] for k in keys] for keys in clip.keys_per_step]
        assert not evaluate.action_response(clip.frames, swapped, CFG.step_px), clip.keys_per_step


@pytest.mark.parametrize(("key", "direction"), [("d", "right"), ("a", "left"), ("w", "up"),
                                                ("s", "down"), ("l", "left"), ("j", "right")])
def test_a_held_key_moves_the_agent_its_way(key, direction):
    clip = agent_clip(0, [[key]] * 4)
    assert evaluate.read_clip(clip.frames).direction == direction


def test_clicks_mark_the_steps_an_edge_stopped(agent_clips):
    blocked = [c for c in agent_clips if any(c.blocked)]
    assert len(blocked) >= 10
    for clip in agent_clips:
        expected = [step + 1 for step, hit in enumerate(clip.blocked) if hit]
        assert evaluate.click_frames(clip.sound, clip.fps, clip.sample_rate_hz) == expected


def test_stream_clips_name_the_current_colour():
    for seed in range(NUM_SEEDS):
        clip = make_clip(seed, "stream")
        read = [evaluate.read_frame(frame).colour for frame in clip.frames]
        assert read == list(clip.colour_per_frame)
        assert len(set(read)) > 1


def test_an_empty_frame_reads_no_shape():
    frame = np.zeros((CFG.height_px, CFG.width_px, 3), dtype=np.uint8)
    reading = evaluate.read_frame(frame)
    assert (reading.background, reading.colour, reading.shape) == ("black", None, None)
    assert evaluate.read_clip(frame[None].repeat(3, axis=0)).direction is None


def test_exact_match_answers(motion_clips):
    clip = motion_clips[0]
    for capability in QUESTIONS:
        expected = answer(clip, capability)
        assert evaluate.answer_matches(f" {expected.upper()}. ", expected)
    assert answer(clip, "caption") == describe(clip.scene)
    assert not evaluate.answer_matches("red", "blue")
    assert not evaluate.answer_matches("a red circle", "a red circle moving left")


def test_largest_blob_joins_runs_across_rows():
    """A U joined only at its bottom row is one blob (12 px) and beats a separate 3x3 (9 px);
    diagonal neighbours are not joined."""
    mask = np.zeros((8, 12), dtype=bool)
    mask[1:6, 1] = mask[1:6, 4] = True  # the U's arms
    mask[5, 1:5] = True  # its bottom
    mask[1:4, 8:11] = True  # a 3x3 square
    mask[6, 5] = True  # touches the U only diagonally
    blob = evaluate.largest_blob(mask)
    assert blob.sum() == 12 and blob[1, 1] and blob[1, 4] and not blob[6, 5]
    assert not blob[1:4, 8:11].any()
    assert evaluate.largest_blob(np.zeros((4, 4), dtype=bool)) is None
