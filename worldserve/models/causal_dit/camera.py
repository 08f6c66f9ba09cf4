"""Camera keys per output frame -> one conditioning vector per latent frame.

Keys `w a s d` move, `i j k l` look (spec realtime-video.md section 3.3). Each latent frame
covers several output frames (the session's first latent frame covers one, later ones
`temporal_upsampling`); its vector is the fraction of those output frames that held each key.
"""

from __future__ import annotations

import torch

from worldserve.errors import InvalidRequest
from worldserve.models.causal_dit.model import CAMERA_KEYS

KEY_INDEX = {key: i for i, key in enumerate(CAMERA_KEYS)}


def output_frames_per_latent(first_chunk: bool, num_latent_frames: int,
                             upsampling: int) -> list[int]:
    """How many output frames each latent frame of a block decodes to."""
    counts = [upsampling] * num_latent_frames
    if first_chunk:
        counts[0] = 1
    return counts


def camera_vectors(camera: list[list[str]] | None, counts: list[int],
                   max_entries: int) -> torch.Tensor:
    """(len(counts), num_keys) key-hold fractions; missing entries mean "no key held".

    `camera` has one key list per output frame. Up to `max_entries` (the steady-state frames per
    chunk) are accepted so a control queue that always sends a full chunk's worth also works for
    the shorter first chunk; entries past this chunk's frames are not used.
    """
    vectors = torch.zeros(len(counts), len(CAMERA_KEYS))
    if not camera:
        return vectors
    if len(camera) > max_entries:
        raise InvalidRequest(f"camera has {len(camera)} key lists; at most {max_entries} "
                             "(one per output frame of the chunk) are accepted")
    for held in camera:
        for key in held:
            if key not in KEY_INDEX:
                raise InvalidRequest(f"unknown camera key {key!r}; use one of "
                                     f"{' '.join(CAMERA_KEYS)}")
    frame = 0
    for latent, count in enumerate(counts):
        for held in camera[frame:frame + count]:
            for key in set(held):
                vectors[latent, KEY_INDEX[key]] += 1.0 / count
        frame += count
    return vectors
