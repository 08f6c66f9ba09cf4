"""Agent dynamics of the dev world: held keys (or Cosmos3 camera_pose vectors) move the agent.

One key set per step (worldserve.models.camera_keys' convention: entry j is what was held while
frame j + 1 was produced). WASD move the agent one world step; IJKL pan the view one step, so the
agent's image moves the opposite way (`vocab.KEY_STEPS`). The agent stays in view: a step that
would take its bounding box past the frame's edge is stopped there, and the stop clicks.

Cosmos3 takes the same keys as 9-D `camera_pose` deltas (worldserve/models/cosmos3/world.py
`pose_deltas`: translation, then the rotation's first two columns, SANA-WM's rollout at 0.05
units and 1.2 degrees per frame). `screen_step_of_pose` reads a delta back as a screen step, so
actions a model emits (policy, inverse dynamics) are scored in the same units as keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from worldserve.models.dev.world.vocab import KEY_STEPS

# SANA-WM's rollout speeds (diffusers sana_wm/cam_utils.py); a delta counts as a step when it
# reaches half of one.
_TRANSLATION_PER_STEP = 0.05
_ROTATION_PER_STEP_RAD = math.radians(1.2)


def screen_step(keys: list[str]) -> tuple[int, int]:
    """(dx, dy) in world steps for one held key set; unknown keys are ignored."""
    dx = sum(KEY_STEPS[k][0] for k in set(keys) if k in KEY_STEPS)
    dy = sum(KEY_STEPS[k][1] for k in set(keys) if k in KEY_STEPS)
    return dx, dy


def screen_step_of_pose(pose: np.ndarray) -> tuple[int, int]:
    """(dx, dy) in world steps for one 9-D camera_pose delta [tx, ty, tz, r00, r10, r20, r01,
    r11, r21]: +tx (d) right, +tz (w) up; yaw right (l, r20 < 0) and pitch down (k, r21 < 0)
    move the scene left / up."""
    tx, tz, r20, r21 = float(pose[0]), float(pose[2]), float(pose[5]), float(pose[8])
    half_t, half_r = _TRANSLATION_PER_STEP / 2, math.sin(_ROTATION_PER_STEP_RAD) / 2
    move_x = (tx > half_t) - (tx < -half_t)
    move_y = (tz < -half_t) - (tz > half_t)
    pan_x = (r20 > half_r) - (r20 < -half_r)  # yaw left (j): r20 > 0, scene moves right
    pan_y = (r21 > half_r) - (r21 < -half_r)  # pitch up (i): r21 > 0, scene moves down
    return move_x + pan_x, move_y + pan_y


@dataclass(frozen=True)
class AgentTrack:
    """Where the agent's bounding box (top-left, pixels) is at each frame, and which steps the
    frame's edge stopped (a click at frame j + 1 for step j)."""

    positions_px: np.ndarray  # (num_steps + 1, 2) int: x, y
    blocked: tuple[bool, ...]  # one per step

    def steps_px(self) -> np.ndarray:
        """(num_steps, 2) displacement per step, after stops at the edge."""
        return np.diff(self.positions_px, axis=0)


def roll_out(start_px: tuple[int, int], side_px: int, keys_per_step: list[list[str]],
             width_px: int, height_px: int, step_px: int) -> AgentTrack:
    """Apply the held keys step by step from `start_px`, keeping the agent inside the frame."""
    x, y = start_px
    positions, blocked = [(x, y)], []
    for keys in keys_per_step:
        dx, dy = screen_step(keys)
        want_x, want_y = x + dx * step_px, y + dy * step_px
        x = int(np.clip(want_x, 0, width_px - side_px))
        y = int(np.clip(want_y, 0, height_px - side_px))
        blocked.append((x, y) != (want_x, want_y))
        positions.append((x, y))
    return AgentTrack(np.array(positions, dtype=np.int64), tuple(blocked))
