"""Seeded scenes and clips of the dev world.

`make_clip(seed, kind)` is deterministic: the same seed, kind and config give the same frames,
sound and labels on every machine (numpy's PCG64 stream, PIL drawing without anti-aliasing).
Kinds:
- "image": one frame (text-to-image);
- "motion": a shape moving one way (or still) for `num_frames` frames, its whole path in view
  (text-to-video, image-to-video, video continuation, captions);
- "agent": a shape moved by one held key set per step (actions, camera keys, realtime);
- "stream": a still shape whose colour changes every `change_every` frames (live reasoning).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from worldserve.models.dev.world.agent import AgentTrack, roll_out
from worldserve.models.dev.world.render import draw_frame, sound_track
from worldserve.models.dev.world.vocab import (
    BACKGROUNDS,
    COLOURS,
    DIRECTION_STEPS,
    DIRECTIONS,
    KEY_STEPS,
    SHAPES,
)

KINDS = ("image", "motion", "agent", "stream")


@dataclass(frozen=True)
class WorldConfig:
    """Sizes of the dev world (docs/dev-world.md says why these fit the dev models' latents)."""

    width_px: int = 64  # multiple of 16 (Cosmos3's VAE) and 8 (the causal Wan VAE)
    height_px: int = 64
    min_side_px: int = 20  # a shape covers at least 1.25 x 1.25 Cosmos3 latent cells (16 px)
    max_side_px: int = 28
    step_px: int = 3  # per frame: a 9-frame clip travels 24 px, 1.5 latent cells
    num_frames: int = 9  # 4k + 1, the Wan/Cosmos3 VAEs' temporal stride 4
    fps: float = 24.0
    sample_rate_hz: int = 400  # the dev Cosmos3 sound tokenizer's rate
    change_every: int = 4  # stream clips: frames between colour changes

    def __post_init__(self) -> None:
        travel_px = self.step_px * (self.num_frames - 1)
        if self.max_side_px + travel_px > min(self.width_px, self.height_px):
            raise ValueError(
                f"a {self.max_side_px} px shape moving {travel_px} px does not fit a "
                f"{self.width_px}x{self.height_px} frame; lower max_side_px, step_px or num_frames")


@dataclass(frozen=True)
class Scene:
    """What a clip shows: the labels the evaluator must read back."""

    colour: str
    shape: str
    background: str
    direction: str  # "still" for images, agent and stream clips
    side_px: int
    start_px: tuple[int, int]  # top-left of the shape's bounding box in frame 0


@dataclass(frozen=True)
class WorldClip:
    """Frames (T, H, W, 3) uint8, sound (2, N) float32 and the labels that made them."""

    kind: str
    scene: Scene
    frames: np.ndarray
    sound: np.ndarray
    fps: float
    sample_rate_hz: int
    colour_per_frame: tuple[str, ...]
    positions_px: np.ndarray  # (T, 2) top-left of the shape per frame
    keys_per_step: list[list[str]] = field(default_factory=list)  # agent clips: T - 1 entries
    blocked: tuple[bool, ...] = ()  # agent clips: steps the frame's edge stopped (clicks)


def make_clip(seed: int, kind: str = "motion", cfg: WorldConfig = WorldConfig()) -> WorldClip:
    """The clip of `kind` for `seed` (see the module docstring)."""
    if kind not in KINDS:
        raise ValueError(f"unknown clip kind {kind!r}; use one of {', '.join(KINDS)}")
    rng = np.random.default_rng([KINDS.index(kind), seed])
    if kind == "agent":
        scene = sample_agent_scene(rng, cfg)
        keys = sample_keys(rng, cfg.num_frames - 1)
        track = roll_out(scene.start_px, scene.side_px, keys, cfg.width_px, cfg.height_px,
                         cfg.step_px)
        return _agent_clip(scene, keys, track, cfg)
    scene = sample_scene(rng, cfg, moving=kind == "motion")
    num_frames = 1 if kind == "image" else cfg.num_frames
    colours = ([scene.colour] * num_frames if kind != "stream"
               else stream_colours(rng, scene.colour, num_frames, cfg.change_every))
    return render_clip(kind, scene, colours, motion_path(scene, num_frames, cfg.step_px), cfg)


def sample_scene(rng: np.random.Generator, cfg: WorldConfig, moving: bool) -> Scene:
    """Uniform labels; a start position from which the whole path stays in view."""
    colour = _choice(rng, tuple(COLOURS))
    shape = _choice(rng, SHAPES)
    background = _choice(rng, tuple(BACKGROUNDS))
    direction = _choice(rng, DIRECTIONS) if moving else "still"
    side_px = int(rng.integers(cfg.min_side_px, cfg.max_side_px + 1))
    travel_px = cfg.step_px * (cfg.num_frames - 1) if moving else 0
    dx, dy = DIRECTION_STEPS[direction]
    x_px = _start(rng, cfg.width_px - side_px, dx * travel_px)
    y_px = _start(rng, cfg.height_px - side_px, dy * travel_px)
    return Scene(colour, shape, background, direction, side_px, (x_px, y_px))


def sample_agent_scene(rng: np.random.Generator, cfg: WorldConfig) -> Scene:
    """An agent starts in the middle half of its room, so most held keys move it for several
    steps before an edge stops it (and clicks)."""
    scene = sample_scene(rng, cfg, moving=False)
    start = tuple(_start(rng, (room - room // 2), 0) + room // 4
                  for room in (cfg.width_px - scene.side_px, cfg.height_px - scene.side_px))
    return dataclasses.replace(scene, start_px=start)


def sample_keys(rng: np.random.Generator, num_steps: int) -> list[list[str]]:
    """One or two runs of a held key (or none): most chunks ask for one clear move."""
    options = [[]] + [[k] for k in KEY_STEPS]
    first = options[int(rng.integers(len(options)))]
    if rng.random() < 0.5 or num_steps < 2:
        return [list(first) for _ in range(num_steps)]
    split = int(rng.integers(1, num_steps))
    second = options[int(rng.integers(len(options)))]
    return [list(first) for _ in range(split)] + [list(second) for _ in range(num_steps - split)]


def stream_colours(rng: np.random.Generator, first: str, num_frames: int,
                   change_every: int) -> list[str]:
    """The shape's colour per frame: a different colour every `change_every` frames."""
    colours, current = [], first
    for frame in range(num_frames):
        if frame and frame % change_every == 0:
            current = _choice(rng, tuple(c for c in COLOURS if c != current))
        colours.append(current)
    return colours


def motion_path(scene: Scene, num_frames: int, step_px: int) -> np.ndarray:
    """(num_frames, 2) top-left positions of a shape moving `scene.direction`."""
    dx, dy = DIRECTION_STEPS[scene.direction]
    frame = np.arange(num_frames)[:, None]
    return np.array(scene.start_px)[None, :] + frame * step_px * np.array([dx, dy])[None, :]


def render_clip(kind: str, scene: Scene, colour_per_frame: list[str], positions_px: np.ndarray,
                cfg: WorldConfig, keys_per_step: list[list[str]] | None = None,
                blocked: tuple[bool, ...] = ()) -> WorldClip:
    """Draw the frames and the sound track of a clip whose path is already decided."""
    frames = np.stack([
        draw_frame(cfg.width_px, cfg.height_px, scene.background, scene.shape, colour,
                   int(x), int(y), scene.side_px)
        for colour, (x, y) in zip(colour_per_frame, positions_px, strict=True)])
    clicks = [step + 1 for step, hit in enumerate(blocked) if hit]
    sound = sound_track(colour_per_frame, clicks, cfg.fps, cfg.sample_rate_hz)
    return WorldClip(kind, scene, frames, sound, cfg.fps, cfg.sample_rate_hz,
                     tuple(colour_per_frame), np.asarray(positions_px), keys_per_step or [],
                     blocked)


def agent_clip(seed: int, keys_per_step: list[list[str]],
               cfg: WorldConfig = WorldConfig()) -> WorldClip:
    """The agent of `seed`'s scene driven by the given keys (the realtime and action checks)."""
    scene = sample_agent_scene(np.random.default_rng([KINDS.index("agent"), seed]), cfg)
    track = roll_out(scene.start_px, scene.side_px, keys_per_step, cfg.width_px,
                     cfg.height_px, cfg.step_px)
    return _agent_clip(scene, keys_per_step, track, cfg)


def _agent_clip(scene: Scene, keys: list[list[str]], track: AgentTrack,
                cfg: WorldConfig) -> WorldClip:
    colours = [scene.colour] * len(track.positions_px)
    return render_clip("agent", scene, colours, track.positions_px, cfg, keys, track.blocked)


def _start(rng: np.random.Generator, room_px: int, travel_px: int) -> int:
    """A start coordinate in [0, room] whose end (start + travel) is in [0, room] too."""
    low, high = max(0, -travel_px), min(room_px, room_px - travel_px)
    return int(rng.integers(low, high + 1))


def _choice(rng: np.random.Generator, options: tuple[str, ...]) -> str:
    return options[int(rng.integers(len(options)))]
