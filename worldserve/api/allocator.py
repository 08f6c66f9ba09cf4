"""glibc's malloc, held to fixed thresholds in the api process.

glibc moves two thresholds on its own: when a block it had mmapped (128 KiB or more at start) is
freed, `M_MMAP_THRESHOLD` rises to that block's size (up to 32 MiB) and `M_TRIM_THRESHOLD` to
twice that. The api frees large blocks all day (request bodies, hostile bodies of megabytes,
frames from the stages), so after the first one every later block up to that size comes from the
main arena's heap instead of its own mapping, and the long-lived small objects placed between
them keep the heap from shrinking: the memory is free but stays resident, and RSS creeps up
(docs/operations.md, the api's growth). Setting either threshold explicitly turns glibc's
adjustment off (mallopt(3)); both are held at glibc's own starting values, so large blocks keep
their own mappings and go back to the system when freed.
"""

from __future__ import annotations

import ctypes
import logging
import platform

log = logging.getLogger("worldserve.api")

M_TRIM_THRESHOLD = -1  # <malloc.h>
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's initial M_MMAP_THRESHOLD, held
TRIM_THRESHOLD_BYTES = 128 * 1024  # glibc's initial M_TRIM_THRESHOLD, held


def hold_malloc_thresholds() -> bool:
    """Fix glibc's mmap and trim thresholds for this process; False where the C library is not
    glibc (nothing to do: others do not move their thresholds this way) or mallopt refused."""
    if platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    held = (libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
            and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1)
    if not held:
        log.warning("mallopt refused the malloc thresholds: the api's freed memory may stay "
                    "resident")
    return held
