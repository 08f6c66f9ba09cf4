"""The evaluator's own accuracy: how often it reads back the labels its generator drew.

This is the ceiling of every figure `benchmarks/quality.py` reports about a model: a capability
the evaluator cannot read on ground truth cannot be scored on generated output either.
"""

from __future__ import annotations

from worldserve.models.dev.world import evaluate
from worldserve.models.dev.world.scenes import WorldConfig, make_clip


def evaluator_accuracy(seeds: range, cfg: WorldConfig = WorldConfig()) -> dict[str, float]:
    """capability -> fraction of `seeds` whose label the evaluator reads back exactly."""
    hits: dict[str, list[bool]] = {name: [] for name in (
        "colour", "shape", "background", "direction", "image", "tone", "action_response",
        "clicks", "colour_now")}
    for seed in seeds:
        _motion(make_clip(seed, "motion", cfg), hits)
        image = make_clip(seed, "image", cfg)
        reading = evaluate.read_frame(image.frames[0])
        hits["image"].append((reading.colour, reading.shape, reading.background) == (
            image.scene.colour, image.scene.shape, image.scene.background))
        agent = make_clip(seed, "agent", cfg)
        hits["action_response"].append(
            evaluate.action_response(agent.frames, agent.keys_per_step, cfg.step_px))
        clicks = [step + 1 for step, hit in enumerate(agent.blocked) if hit]
        hits["clicks"].append(evaluate.click_frames(agent.sound, agent.fps, agent.sample_rate_hz)
                              == clicks)
        stream = make_clip(seed, "stream", cfg)
        hits["colour_now"].append(
            evaluate.read_frame(stream.frames[-1]).colour == stream.colour_per_frame[-1])
    return {name: sum(found) / len(found) for name, found in hits.items()}


def _motion(clip, hits: dict[str, list[bool]]) -> None:
    reading = evaluate.read_clip(clip.frames)
    for label in ("colour", "shape", "background", "direction"):
        hits[label].append(getattr(reading, label) == getattr(clip.scene, label))
    tone, _ = evaluate.dominant_tone(clip.sound, clip.sample_rate_hz)
    hits["tone"].append(tone == clip.scene.colour)
