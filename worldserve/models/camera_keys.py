"""Held camera keys per output frame (WASD/IJKL, spec section 3), shared by the families that
take camera keys: validation, and the run-length action DSL ("w-8,jw-4,none-12").

SANA-WM rolls a camera trajectory out of one action entry per generated frame (diffusers
`sana_wm/cam_utils.py`: 0.05 units / 1.2 degrees per frame, from identity); the Cosmos3 world
runner turns the same rollout into 9-D pose deltas. A chunk of `1 + n` pipeline frames needs
`n` entries; entry j is the key set that produced frame j + 1.
"""

from __future__ import annotations

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
