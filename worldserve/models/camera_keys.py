"""Held camera keys per output frame (WASD/IJKL, spec section 3), shared by the families that
take camera keys: validation, and the run-length action DSL ("w-8,jw-4,none-12").

SANA-WM rolls a camera trajectory out of one action entry per generated frame (diffusers
`sana_wm/cam_utils.py`: 0.05 units / 1.2 degrees per frame, from identity); the Cosmos3 world
runner turns the same rollout into 9-D pose deltas. A chunk of `1 + n` pipeline frames needs
`n` entries; entry j is the key set that produced frame j + 1.
"""

from __future__ import annotations

import math
from typing import Any

from worldserve.errors import InvalidRequest

CAMERA_KEYS = "wasdijkl"


def check_camera(camera: list[list[str]] | None, max_entries: int) -> None:
    if not camera:
        return
    if len(camera) > max_entries:
        raise InvalidRequest(f"camera has {len(camera)} key lists; at most {max_entries} "
                             "(one per output frame of the chunk) are accepted")
    for held in camera:
        for key in held:
            if not isinstance(key, str) or len(key) != 1 or key not in CAMERA_KEYS:
                raise InvalidRequest(f"unknown camera key {key!r}; use one of "
                                     f"{' '.join(CAMERA_KEYS)}")


def action_string(camera: list[list[str]] | None, num_entries: int) -> str:
    """Run-length DSL of `num_entries` key sets (missing entries: no key held)."""
    camera = camera or []
    runs: list[tuple[str, int]] = []
    for i in range(num_entries):
        keys = "".join(sorted(set(camera[i]))) if i < len(camera) else ""
        keys = keys or "none"
        if runs and runs[-1][0] == keys:
            runs[-1] = (keys, runs[-1][1] + 1)
        else:
            runs.append((keys, 1))
    return ",".join(f"{keys}-{count}" for keys, count in runs)


def rollout_c2w(camera: list[list[str]] | None, num_entries: int,
                start_pitch_steps: int = 0) -> tuple[Any, int]:
    """SANA-WM's rollout (diffusers `sana_wm/cam_utils.action_string_to_c2w`) of `num_entries`
    key sets: c2w (num_entries + 1, 4, 4), float32, OpenCV axes; and the pitch at the end in
    rotation steps.

    The rollout's rotation is always yaw(Y) @ pitch(P), and P moves in whole steps, clamped at
    the pitch limit; a session continuing from an earlier chunk starts at its pitch (`start_
    pitch_steps`, reached by a prefix of `i` / `k` entries that is then dropped) with yaw and
    position reset, which leaves every pose relative to the chunk's first one unchanged.
    """
    from diffusers.pipelines.sana_wm.cam_utils import (
        DEFAULT_ROTATION_SPEED_DEG,
        action_string_to_c2w,
    )

    camera = camera or []
    prefix = [["i" if start_pitch_steps > 0 else "k"]] * abs(start_pitch_steps)
    entries = prefix + [list(camera[i]) if i < len(camera) else [] for i in range(num_entries)]
    c2w = action_string_to_c2w(action_string(entries, len(entries)))[len(prefix):]
    rot = c2w[-1, :3, :3].astype(float)
    pitch = math.atan2(-rot[1, 2], rot[1, 1])
    return c2w, round(pitch / math.radians(DEFAULT_ROTATION_SPEED_DEG))
