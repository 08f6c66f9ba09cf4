"""Frames and sound of the dev world: one flat shape on a plain background, a tone per colour.

Shapes are drawn without anti-aliasing, so every pixel is either the background or the shape's
palette colour and a shape's fill of its bounding box is exact: square 1.0, circle about 0.79
(pi / 4), triangle about 0.5 to 0.56 (apex up).
"""

from __future__ import annotations

import io
import math

import numpy as np
from PIL import Image, ImageDraw

from worldserve.models.dev.world.vocab import BACKGROUNDS, COLOURS, TONES_HZ

TONE_AMPLITUDE = 0.3
# A click is a short burst at the Nyquist frequency (alternating signs): far above every tone,
# so a first difference of the track shows it and the tones barely register.
CLICK_AMPLITUDE = 0.6
CLICK_SAMPLES = 4


def draw_frame(width_px: int, height_px: int, background: str, shape: str, colour: str,
               x_px: int, y_px: int, side_px: int) -> np.ndarray:
    """(height, width, 3) uint8: `shape` with its bounding box's top-left at (x, y)."""
    image = Image.new("RGB", (width_px, height_px), BACKGROUNDS[background])
    draw = ImageDraw.Draw(image)
    box = (x_px, y_px, x_px + side_px - 1, y_px + side_px - 1)
    fill = COLOURS[colour]
    if shape == "square":
        draw.rectangle(box, fill=fill)
    elif shape == "circle":
        draw.ellipse(box, fill=fill)
    elif shape == "triangle":
        apex = (x_px + (side_px - 1) / 2, y_px)
        draw.polygon([apex, (box[0], box[3]), (box[2], box[3])], fill=fill)
    else:
        raise ValueError(f"unknown shape {shape!r}; use one of square, circle, triangle")
    return np.asarray(image, dtype=np.uint8)


def num_sound_samples(num_frames: int, fps: float, sample_rate_hz: int) -> int:
    """Samples covering `num_frames` frames (rounded up, like the pipeline's sound latents)."""
    return math.ceil(num_frames / fps * sample_rate_hz)


def sound_track(colour_per_frame: list[str], click_frames: list[int], fps: float,
                sample_rate_hz: int) -> np.ndarray:
    """(2, N) float32 stereo (both channels equal, like Cosmos3's output): during each frame the
    tone of the shape's colour (phase-continuous across colour changes), plus a click at the
    start of every frame in `click_frames`."""
    num_samples = num_sound_samples(len(colour_per_frame), fps, sample_rate_hz)
    frame_of_sample = np.minimum(
        (np.arange(num_samples) * fps / sample_rate_hz).astype(np.int64), len(colour_per_frame) - 1)
    freqs_hz = np.array([TONES_HZ[colour_per_frame[f]] for f in frame_of_sample])
    phase = 2 * np.pi * np.cumsum(freqs_hz) / sample_rate_hz
    track = TONE_AMPLITUDE * np.sin(phase)
    for frame in click_frames:
        start = math.ceil(frame * sample_rate_hz / fps)
        burst = CLICK_AMPLITUDE * (-1.0) ** np.arange(CLICK_SAMPLES)
        end = min(start + CLICK_SAMPLES, num_samples)
        track[start:end] += burst[: end - start]
    return np.stack([track, track]).astype(np.float32)


def png_bytes(frame: np.ndarray) -> bytes:
    """A (height, width, 3) uint8 frame as PNG bytes: what a client uploads."""
    buffer = io.BytesIO()
    Image.fromarray(frame).save(buffer, format="PNG")
    return buffer.getvalue()
