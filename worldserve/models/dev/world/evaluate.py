"""Pixel and sample statistics that read the dev world's labels back (no learned judge).

- background: the majority of the frame's border pixels, named by the nearest background colour;
- the shape: the largest 4-connected blob of pixels far from the background;
- colour: the majority of the blob's pixels, each named by the nearest palette colour;
- shape: the blob's fill of its bounding box (square 1.0, circle ~0.79, triangle ~0.5-0.56);
- direction: the blob centroid's net move from the first frame to the last, "still" below
  `STILL_BELOW` of the frame's short side;
- action response: that net move against the world's own roll-out of the held keys;
- tone: the FFT peak of the sound, named by the nearest colour tone; clicks: jumps in the track;
- answers: exact match after `grammar.normalise_answer`.
The thresholds sit between the generator's own values with wide margins (docs/dev-world.md);
none is tuned on a test's seed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from worldserve.models.dev.world.agent import roll_out
from worldserve.models.dev.world.grammar import normalise_answer
from worldserve.models.dev.world.vocab import BACKGROUNDS, COLOURS, TONES_HZ, direction_of

# A pixel belongs to the foreground when it is farther than this from the background colour
# (RGB Euclidean; every palette colour is >= 206 from both backgrounds).
FOREGROUND_DISTANCE = 120.0
SQUARE_MIN_FILL = 0.9
CIRCLE_MIN_FILL = 0.65
# A net move shorter than this fraction of the short side is "still" (a clip travels 24 of 64).
STILL_BELOW = 0.1
# A jump between consecutive samples above this is a click (tones move at most 0.53 per sample
# at 400 Hz; a click jumps 1.2).
CLICK_JUMP = 0.9


@dataclass(frozen=True)
class FrameReading:
    """What one frame shows; colour and shape are None when no blob was found."""

    background: str
    colour: str | None
    shape: str | None
    centroid_px: tuple[float, float] | None  # x, y
    box_px: tuple[int, int, int, int] | None  # x0, y0, x1, y1 inclusive
    fill: float


@dataclass(frozen=True)
class ClipReading:
    background: str
    colour: str | None
    shape: str | None
    direction: str | None


def read_frame(frame: np.ndarray) -> FrameReading:
    """Read one (H, W, 3) uint8 frame."""
    pixels = frame.astype(np.float32)
    background = _nearest(_border(pixels), BACKGROUNDS)
    distance = np.linalg.norm(pixels - np.array(BACKGROUNDS[background]), axis=-1)
    blob = largest_blob(distance > FOREGROUND_DISTANCE)
    if blob is None:
        return FrameReading(background, None, None, None, None, 0.0)
    ys, xs = np.nonzero(blob)
    box = (int(xs.min()), int(ys.min()), int(xs.max()), int(ys.max()))
    fill = len(xs) / ((box[2] - box[0] + 1) * (box[3] - box[1] + 1))
    colour = _nearest(pixels[blob], COLOURS)
    return FrameReading(background, colour, shape_of_fill(fill),
                        (float(xs.mean()), float(ys.mean())), box, fill)


def read_clip(frames: np.ndarray) -> ClipReading:
    """Read a (T, H, W, 3) clip: majority labels over frames, direction from the centroids."""
    readings = [read_frame(frame) for frame in frames]
    return ClipReading(_majority([r.background for r in readings]),
                       _majority([r.colour for r in readings]),
                       _majority([r.shape for r in readings]),
                       clip_direction(readings, frames.shape[1:3]))


def shape_of_fill(fill: float) -> str:
    if fill >= SQUARE_MIN_FILL:
        return "square"
    return "circle" if fill >= CIRCLE_MIN_FILL else "triangle"


def clip_direction(readings: list[FrameReading], size_hw: tuple[int, int]) -> str | None:
    """Net centroid move first -> last frame, or None when a frame at either end is empty."""
    first, last = readings[0].centroid_px, readings[-1].centroid_px
    if first is None or last is None:
        return None
    return displacement_direction(last[0] - first[0], last[1] - first[1], size_hw)


def displacement_direction(dx_px: float, dy_px: float, size_hw: tuple[int, int]) -> str:
    """The direction word of a net move. Rounded to 1/100 px first: the centroids of a shape
    shifted by whole pixels differ by float noise, and an exact diagonal (a tie, which
    `direction_of` calls horizontal) must read the same from pixels as from the roll-out."""
    dx_px, dy_px = round(dx_px, 2), round(dy_px, 2)
    if max(abs(dx_px), abs(dy_px)) < STILL_BELOW * min(size_hw):
        return "still"
    return direction_of(dx_px, dy_px)


def expected_agent_direction(first_frame: np.ndarray, keys_per_step: list[list[str]],
                             step_px: int) -> str | None:
    """Where the world moves the agent seen in `first_frame` under the held keys (its roll-out
    stops at the frame's edge), as a net direction; None when no agent is seen."""
    box = read_frame(first_frame).box_px
    if box is None:
        return None
    height, width = first_frame.shape[:2]
    side_px = max(box[2] - box[0], box[3] - box[1]) + 1
    track = roll_out((box[0], box[1]), side_px, keys_per_step, width, height, step_px)
    dx, dy = track.positions_px[-1] - track.positions_px[0]
    return displacement_direction(float(dx), float(dy), (height, width))


def action_response(frames: np.ndarray, keys_per_step: list[list[str]], step_px: int) -> bool:
    """True when the agent moved the way the held keys command (net, over the clip)."""
    expected = expected_agent_direction(frames[0], keys_per_step, step_px)
    observed = read_clip(frames).direction
    return expected is not None and observed == expected


def dominant_tone(sound: np.ndarray, sample_rate_hz: int) -> tuple[str, float]:
    """The colour whose tone is nearest the sound's FFT peak, and the peak (Hz). `sound` is
    (channels, N) or (N,)."""
    mono = np.asarray(sound, dtype=np.float64).reshape(-1, np.shape(sound)[-1]).mean(axis=0)
    spectrum = np.abs(np.fft.rfft((mono - mono.mean()) * np.hanning(len(mono))))
    freqs_hz = np.fft.rfftfreq(len(mono), 1.0 / sample_rate_hz)
    peak_hz = float(freqs_hz[int(np.argmax(spectrum))])
    colour = min(TONES_HZ, key=lambda c: abs(TONES_HZ[c] - peak_hz))
    return colour, peak_hz


def click_frames(sound: np.ndarray, fps: float, sample_rate_hz: int) -> list[int]:
    """Frames whose sound holds a click (a jump between consecutive samples)."""
    mono = np.asarray(sound, dtype=np.float64).reshape(-1, np.shape(sound)[-1]).mean(axis=0)
    samples = np.nonzero(np.abs(np.diff(mono)) > CLICK_JUMP)[0] + 1
    return sorted({int(s * fps / sample_rate_hz) for s in samples})


def answer_matches(reply: str, expected: str) -> bool:
    return normalise_answer(reply) == normalise_answer(expected)


def largest_blob(mask: np.ndarray) -> np.ndarray | None:
    """The largest 4-connected component of a boolean (H, W) mask, or None when it is empty.

    Labels horizontal runs and joins the runs of neighbouring rows that share a column (a
    union-find over runs: a frame has a few dozen, where a pixel flood visits hundreds)."""
    padded = np.pad(mask.astype(np.int8), ((0, 0), (1, 1)))
    edges = np.diff(padded, axis=1)
    starts, ends = np.argwhere(edges == 1), np.argwhere(edges == -1)  # row-major, paired
    if len(starts) == 0:
        return None
    runs = [(int(y), int(x0), int(x1)) for (y, x0), (_, x1) in zip(starts, ends, strict=True)]
    parent = list(range(len(runs)))
    previous: list[int] = []  # run indices of the row above
    current: list[int] = []
    for index, (y, x0, x1) in enumerate(runs):
        if current and runs[current[0]][0] != y:
            previous, current = (current if runs[current[0]][0] == y - 1 else []), []
        for above in previous:
            if runs[above][1] < x1 and x0 < runs[above][2]:
                parent[_root(parent, index)] = _root(parent, above)
        current.append(index)
    sizes: Counter[int] = Counter()
    for index, (_, x0, x1) in enumerate(runs):
        sizes[_root(parent, index)] += x1 - x0
    best = sizes.most_common(1)[0][0]
    blob = np.zeros_like(mask, dtype=bool)
    for index, (y, x0, x1) in enumerate(runs):
        if _root(parent, index) == best:
            blob[y, x0:x1] = True
    return blob


def _root(parent: list[int], index: int) -> int:
    while parent[index] != index:
        parent[index] = parent[parent[index]]
        index = parent[index]
    return index


def _border(pixels: np.ndarray) -> np.ndarray:
    return np.concatenate([pixels[0], pixels[-1], pixels[1:-1, 0], pixels[1:-1, -1]])


def _nearest(pixels: np.ndarray, palette: dict[str, tuple[int, int, int]]) -> str:
    """The palette name most of `pixels` (N, 3) are nearest to."""
    names = list(palette)
    centres = np.array([palette[n] for n in names], dtype=np.float32)
    nearest = np.argmin(np.linalg.norm(pixels[:, None, :] - centres[None], axis=-1), axis=1)
    return names[int(np.bincount(nearest, minlength=len(names)).argmax())]


def _majority(labels: list[str | None]) -> str | None:
    """The most common label (ties: the first seen); None when every label is None."""
    counts = Counter(label for label in labels if label is not None)
    return counts.most_common(1)[0][0] if counts else None
