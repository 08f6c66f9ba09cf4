"""The closed vocabulary of the dev world: colours, backgrounds, shapes, directions, tones.

Every label the generator draws and the evaluator reads back is one of these words, so the
prompt grammar, the reasoner's answers and the pixel statistics share one source of truth.
Colours are saturated primaries far apart in RGB (the closest pair, red and yellow, is 190
apart; every colour is >= 206 from both backgrounds), so the nearest-palette rule still names a
noisy generated pixel correctly.
"""

from __future__ import annotations

# Shape colours (RGB). Order is fixed: it is the label index the samplers draw.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (230, 30, 30),
    "green": (30, 200, 40),
    "blue": (40, 60, 230),
    "yellow": (240, 220, 30),
}
BACKGROUNDS: dict[str, tuple[int, int, int]] = {
    "black": (0, 0, 0),
    "white": (255, 255, 255),
}
SHAPES = ("square", "circle", "triangle")
DIRECTIONS = ("left", "right", "up", "down", "still")
MOVING = DIRECTIONS[:4]
# Screen step (dx, dy) per direction, in units of the world's step; y grows downwards.
DIRECTION_STEPS: dict[str, tuple[int, int]] = {
    "left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1), "still": (0, 0),
}

# One tone per shape colour (Hz). All below 200 Hz: the dev sound tokenizer samples at 400 Hz
# (Nyquist 200 Hz); 30 Hz apart, so a 0.375 s clip (2.7 Hz FFT bins) separates them cleanly.
TONES_HZ: dict[str, float] = {"red": 50.0, "green": 80.0, "blue": 110.0, "yellow": 140.0}

# Camera keys (worldserve.models.camera_keys.CAMERA_KEYS): WASD move the agent, IJKL pan the
# view. A pan moves the whole scene the opposite way on screen, so with one object in view
# `l` (look right) moves the agent's image left, exactly as `a` does.
KEY_STEPS: dict[str, tuple[int, int]] = {
    "w": (0, -1), "s": (0, 1), "a": (-1, 0), "d": (1, 0),
    "i": (0, 1), "k": (0, -1), "j": (1, 0), "l": (-1, 0),
}
# Each key's opposite of the same kind (a step undone, a look turned back).
OPPOSITE_KEYS: dict[str, str] = {"w": "s", "s": "w", "a": "d", "d": "a",
                                 "i": "k", "k": "i", "j": "l", "l": "j"}


def direction_of(dx: float, dy: float) -> str:
    """The direction word of a screen step (dominant axis; zero step: still)."""
    if dx == 0 and dy == 0:
        return "still"
    if abs(dx) >= abs(dy):
        return "right" if dx > 0 else "left"
    return "down" if dy > 0 else "up"
