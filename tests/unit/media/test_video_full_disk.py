"""An MP4 that cannot be written (a full disk: /dev/full answers every write ENOSPC) raises
ENOSPC and leaves no file descriptor open. PyAV kept the file it had opened from the path open
after a failed write: one fd, and the deleted partial file's disk space, per failed video until
the stage exited (issue 34's fault soak: the generation stage's fds 11 -> 31 after a full disk)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from worldserve.media.video import encode_mp4

FULL = Path("/dev/full")


def fds_open_on(path: Path) -> int:
    """File descriptors of this process open on `path` (other tests' threads may open and close
    fds of their own meanwhile, so the process's whole count says nothing)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == str(path)
        except OSError:  # closed since listed (listdir's own fd among them)
            pass
    return count


def test_a_failed_video_write_closes_its_file() -> None:
    frames = np.zeros((9, 32, 48, 3), np.uint8)
    assert fds_open_on(FULL) == 0
    for _ in range(3):
        with pytest.raises(OSError) as failed:
            encode_mp4(frames, 16, FULL, audio=np.zeros((1, 800), np.float32), sample_rate=400)
        assert failed.value.errno == errno.ENOSPC
    assert fds_open_on(FULL) == 0
