"""The dev world's generator: deterministic from a seed, sized for the dev models, and its
grammar round-trips; Cosmos3 camera_pose deltas read back as the keys' screen steps."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from worldserve.models.dev.world import grammar
from worldserve.models.dev.world.agent import screen_step, screen_step_of_pose
from worldserve.models.dev.world.render import num_sound_samples
from worldserve.models.dev.world.scenes import KINDS, WorldConfig, make_clip
from worldserve.models.dev.world.vocab import COLOURS, DIRECTIONS, SHAPES


@pytest.mark.parametrize("kind", KINDS)
def test_a_seed_gives_the_same_clip(kind):
    first, again, other = make_clip(7, kind), make_clip(7, kind), make_clip(8, kind)
    assert np.array_equal(first.frames, again.frames)
    assert np.array_equal(first.sound, again.sound)
    assert first.scene == again.scene and first.keys_per_step == again.keys_per_step
    assert not np.array_equal(first.frames, other.frames)


@pytest.mark.parametrize("kind", KINDS)
def test_clip_shapes_follow_the_config(kind):
    cfg = WorldConfig()
    clip = make_clip(3, kind, cfg)
    num_frames = 1 if kind == "image" else cfg.num_frames
    assert clip.frames.shape == (num_frames, cfg.height_px, cfg.width_px, 3)
    assert clip.frames.dtype == np.uint8
    assert clip.sound.shape == (2, num_sound_samples(num_frames, cfg.fps, cfg.sample_rate_hz))
    assert clip.sound.dtype == np.float32 and np.abs(clip.sound).max() <= 1.0


def test_paths_stay_in_view():
    cfg = WorldConfig()
    for seed, kind in itertools.product(range(100), ("motion", "agent")):
        clip = make_clip(seed, kind, cfg)
        assert clip.positions_px.min() >= 0
        assert clip.positions_px[:, 0].max() + clip.scene.side_px <= cfg.width_px
        assert clip.positions_px[:, 1].max() + clip.scene.side_px <= cfg.height_px


def test_a_config_whose_motion_cannot_fit_is_refused():
    with pytest.raises(ValueError, match="max_side_px"):
        WorldConfig(width_px=32, height_px=32)


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="motion"):
        make_clip(0, "movie")


def test_every_corpus_prompt_parses_back():
    prompts = [line for line in grammar.corpus() if line.startswith("a ")]
    assert len(prompts) == len(COLOURS) * len(SHAPES) * 2 * (len(DIRECTIONS) + 2)
    for prompt in prompts:
        labels = grammar.parse_prompt(prompt)
        assert labels.colour in COLOURS and labels.shape in SHAPES
        assert labels.background in ("black", "white")
        assert labels.agent == prompt.endswith(("agent on black", "agent on white"))


def test_clip_prompts_name_the_clip():
    for seed in range(20):
        clip = make_clip(seed, "motion")
        labels = grammar.parse_prompt(grammar.describe(clip.scene))
        scene = clip.scene
        assert (labels.colour, labels.shape, labels.background, labels.direction) == (
            scene.colour, scene.shape, scene.background, scene.direction)


def test_prompts_outside_the_grammar_parse_to_nothing():
    labels = grammar.parse_prompt("A purple dragon flying over the sea!")
    assert labels == grammar.PromptLabels(None, None, None, None)
    assert grammar.parse_prompt("a BLUE Circle, moving Up.").direction == "up"
    assert grammar.parse_prompt("a green color square").colour == "green"


def test_sampled_prompts_are_seeded_and_cover_the_grammar():
    prompts = grammar.sample_prompts(0, 200)
    assert prompts == grammar.sample_prompts(0, 200) != grammar.sample_prompts(1, 200)
    assert {grammar.parse_prompt(p).direction for p in prompts} == set(DIRECTIONS)


def test_camera_pose_deltas_read_back_as_key_steps():
    """The Cosmos3 world runner's 9-D deltas for every key set of one or two keys (held twice,
    so pitched and yawed starts are covered) give the key set's screen step."""
    from worldserve.models.cosmos3.world import pose_deltas

    key_sets = [[]] + [list(pair) for n in (1, 2) for pair in itertools.combinations("wasdijkl", n)]
    held = key_sets * 2
    poses = pose_deltas(held, len(held)).numpy()
    assert [screen_step_of_pose(p) for p in poses] == [screen_step(k) for k in held]
