"""The prompt and question grammar of the dev world (docs/dev-world.md lists it for users).

Prompts:   a <colour> <shape> [on <background>] [moving <left|right|up|down> | standing still]
           a <colour> <shape> agent [on <background>]          (driven by actions / keys)
Questions: one per `QUESTIONS` entry; answers are single words from `vocab`, or the clip's
           canonical prompt for "describe the clip.".
Anything else is outside the grammar: it still runs, the evaluator just cannot score it.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass

import numpy as np

from worldserve.models.dev.world.scenes import Scene, WorldClip
from worldserve.models.dev.world.vocab import BACKGROUNDS, COLOURS, DIRECTIONS, MOVING, SHAPES

# capability -> the question asked (the first spelling is the canonical one)
QUESTIONS: dict[str, tuple[str, ...]] = {
    "colour": ("what colour is the shape?", "what color is the shape?"),
    "shape": ("what shape is it?",),
    "direction": ("which way does it move?",),
    "background": ("what colour is the background?", "what color is the background?"),
    "caption": ("describe the clip.",),
    "colour_now": ("what colour is it now?", "what color is it now?"),
}


@dataclass(frozen=True)
class PromptLabels:
    """What a prompt asks for; None where the prompt does not say."""

    colour: str | None
    shape: str | None
    background: str | None
    direction: str | None
    agent: bool = False


def describe(scene: Scene, kind: str = "motion") -> str:
    """The canonical prompt of a scene, which is also the caption the reasoner should give."""
    subject = f"a {scene.colour} {scene.shape}"
    if kind == "agent":
        return f"{subject} agent on {scene.background}"
    if kind in ("image", "stream"):
        return f"{subject} on {scene.background}"
    motion = "standing still" if scene.direction == "still" else f"moving {scene.direction}"
    return f"{subject} on {scene.background} {motion}"


def answer(clip: WorldClip, capability: str) -> str:
    """The exact answer to `QUESTIONS[capability]` about `clip` (at its last frame for
    "colour_now")."""
    scene = clip.scene
    answers = {"colour": scene.colour, "shape": scene.shape, "direction": scene.direction,
               "background": scene.background, "caption": describe(scene, clip.kind),
               "colour_now": clip.colour_per_frame[-1]}
    if capability not in answers:
        raise ValueError(f"unknown capability {capability!r}; use one of {', '.join(answers)}")
    return answers[capability]


def normalise_answer(text: str) -> str:
    """Lower case, single spaces, no surrounding punctuation: what exact match compares."""
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def parse_prompt(text: str) -> PromptLabels:
    """The labels a prompt names (the grammar's words; "color" spelled either way)."""
    words = normalise_answer(text).replace("color", "colour").split()
    background = next(
        (nxt for w, nxt in zip(words, words[1:]) if w == "on" and nxt in BACKGROUNDS), None)
    direction = None
    if "still" in words:
        direction = "still"
    elif "moving" in words:
        after = words[words.index("moving") + 1:]
        direction = next((w for w in after if w in MOVING), None)
    return PromptLabels(colour=_first(words, COLOURS), shape=_first(words, SHAPES),
                        background=background, direction=direction, agent="agent" in words)


def sample_prompts(seed: int, num_prompts: int, kind: str = "motion") -> list[str]:
    """`num_prompts` canonical prompts drawn uniformly from the grammar (seeded)."""
    rng = np.random.default_rng([100, seed])
    prompts = []
    for _ in range(num_prompts):
        scene = Scene(_pick(rng, tuple(COLOURS)), _pick(rng, SHAPES),
                      _pick(rng, tuple(BACKGROUNDS)),
                      _pick(rng, DIRECTIONS) if kind == "motion" else "still", 0, (0, 0))
        prompts.append(describe(scene, kind))
    return prompts


def corpus() -> Iterator[str]:
    """Every canonical prompt, question and answer (the dev tokenizer's training text)."""
    for colour in COLOURS:
        for shape in SHAPES:
            for background in BACKGROUNDS:
                for direction in DIRECTIONS:
                    yield describe(Scene(colour, shape, background, direction, 0, (0, 0)))
                for kind in ("image", "agent"):
                    yield describe(Scene(colour, shape, background, "still", 0, (0, 0)), kind)
    for spellings in QUESTIONS.values():
        yield from spellings
    yield from (*COLOURS, *SHAPES, *BACKGROUNDS, *DIRECTIONS)


def _first(words: list[str], vocabulary: Collection[str]) -> str | None:
    return next((w for w in words if w in vocabulary), None)


def _pick(rng: np.random.Generator, options: tuple[str, ...]) -> str:
    return options[int(rng.integers(len(options)))]
