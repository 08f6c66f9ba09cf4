"""Writing finished outputs under the stage's output directory (atomically: temp + rename)."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import numpy as np

from worldserve.errors import InternalError, InvalidRequest, StorageFull, WorldserveError
from worldserve.ipc.messages import ActionOutput
from worldserve.media.images import EXTENSIONS, encode_image
from worldserve.media.video import encode_mp4
from worldserve.models.types import RowExtras

NO_FILE = "none"  # output_format of requests whose result is data only (actions)
# The job-id alphabet (api/jobs/ledger.py): a uuid, plus `.<api replica>` in cluster mode
# (cluster/ids.py). A name built from it never holds a path separator, never starts with a dot
# and never contains `..`, so it cannot leave the output directory.
_WORD = r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}"
_STEM = re.compile(rf"{_WORD}(\.{_WORD})?")


def output_names(stem: str, output_format: str, count: int) -> list[str]:
    """`<stem>.<ext>` for one output, `<stem>_<i>.<ext>` for several (spec §3.1)."""
    if not _STEM.fullmatch(stem):
        raise InvalidRequest(f"output stem {stem!r} is not a job id (letters, digits, '_', '-', "
                             "and at most one '.' between two such words)")
    if output_format == NO_FILE:
        return []
    ext = "mp4" if output_format == "mp4" else EXTENSIONS.get(output_format)
    if ext is None:
        raise InvalidRequest(f"output_format={output_format} is not supported",
                             param="output_format")
    if count == 1:
        return [f"{stem}.{ext}"]
    return [f"{stem}_{i}.{ext}" for i in range(count)]


def write_output(root: Path, name: str, frames: np.ndarray, output_format: str, fps: int,
                 compression: int, *, audio: np.ndarray | None = None,
                 sample_rate: int | None = None) -> None:
    """frames: uint8 (T, H, W, 3). Images write frame 0; videos write every frame, and the
    `audio` waveform (channels, samples) as an AAC track when given."""
    target = root / name
    partial = root / f".{name}.partial"
    try:
        if output_format == "mp4":
            encode_mp4(frames, fps, partial, compression, audio=audio, sample_rate=sample_rate)
        else:
            partial.write_bytes(encode_image(frames[0], output_format, compression))
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


def remove_outputs(root: Path, names: list[str]) -> None:
    """Delete outputs already written for a request that failed (a client never gets part of
    a request's files)."""
    for name in names:
        (root / name).unlink(missing_ok=True)


def write_error(name: str, exc: OSError) -> WorldserveError:
    """The error a request gets when its output `name` cannot be written."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageFull(f"cannot write output {name}: the output directory's disk is full "
                           f"({exc.strerror}); free space there or lower --output-ttl")
    return InternalError(f"cannot write output {name}: {exc.strerror or exc}")


def to_uint8(frames: np.ndarray) -> np.ndarray:
    """[0, 1] float frames -> uint8, rounded like the pipelines' own "pil" output."""
    return (np.clip(frames, 0.0, 1.0) * 255.0).round().astype(np.uint8)


def action_output(extras: RowExtras | None) -> ActionOutput | None:
    """A row's predicted actions for the result message (None when it predicted none)."""
    if extras is None or extras.action is None:
        return None
    values = np.ascontiguousarray(extras.action, dtype="<f4")
    return ActionOutput(values=values.tobytes(), shape=list(values.shape),
                        action_mode=extras.action_mode or "", domain_id=extras.domain_id)
