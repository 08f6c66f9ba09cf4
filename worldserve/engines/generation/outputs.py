"""Writing finished outputs under the stage's output directory (atomically: temp + rename)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from worldserve.errors import InvalidRequest
from worldserve.media.images import EXTENSIONS, encode_image
from worldserve.media.video import encode_mp4

_STEM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")


def output_names(stem: str, output_format: str, count: int) -> list[str]:
    """`<stem>.<ext>` for one output, `<stem>_<i>.<ext>` for several (spec §3.1)."""
    if not _STEM.match(stem):
        raise InvalidRequest(f"output stem {stem!r} is not a plain identifier")
    ext = "mp4" if output_format == "mp4" else EXTENSIONS.get(output_format)
    if ext is None:
        raise InvalidRequest(f"output_format={output_format} is not supported",
                             param="output_format")
    if count == 1:
        return [f"{stem}.{ext}"]
    return [f"{stem}_{i}.{ext}" for i in range(count)]


def write_output(root: Path, name: str, frames: np.ndarray, output_format: str, fps: int,
                 compression: int) -> None:
    """frames: uint8 (T, H, W, 3). Images write frame 0; videos write every frame."""
    target = root / name
    partial = root / f".{name}.partial"
    try:
        if output_format == "mp4":
            encode_mp4(frames, fps, partial, compression)
        else:
            partial.write_bytes(encode_image(frames[0], output_format, compression))
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


def to_uint8(frames: np.ndarray) -> np.ndarray:
    """[0, 1] float frames -> uint8, rounded like the pipelines' own "pil" output."""
    return (np.clip(frames, 0.0, 1.0) * 255.0).round().astype(np.uint8)
