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

What the thresholds cannot return is free memory inside the heap, below a live block: glibc
gives back only the heap's top. Its pages, once touched, stay resident while they are free, so
the api's RSS creeps towards the heap's full extent. `returning_free_pages` (the app's lifespan)
calls `malloc_trim(0)` every minute, which hands every whole free page inside the arenas back
(3 ms on a 350 MB fragmented test heap; the api's is about 25 MB), so a burst's freed pages go
back within a minute. (Over a 2-hour soak the api's heap stops growing at about 24 MB:
docs/operations.md.)
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import logging
import platform
from typing import AsyncContextManager

from worldserve.api.background import running

log = logging.getLogger("worldserve.api")

M_TRIM_THRESHOLD = -1  # <malloc.h>
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's initial M_MMAP_THRESHOLD, held
TRIM_THRESHOLD_BYTES = 128 * 1024  # glibc's initial M_TRIM_THRESHOLD, held
TRIM_EVERY_S = 60.0  # how often the api hands free pages inside its heap back


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """This process's C library where it is glibc, else None; looked up once (`libc_ver` scans
    the interpreter's executable)."""
    return ctypes.CDLL(None) if platform.libc_ver()[0] == "glibc" else None


def hold_malloc_thresholds() -> bool:
    """Fix glibc's mmap and trim thresholds for this process; False where the C library is not
    glibc (nothing to do: others do not move their thresholds this way) or mallopt refused."""
    libc = _glibc()
    if libc is None:
        return False
    held = (libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
            and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1)
    if not held:
        log.warning("mallopt refused the malloc thresholds: the api's freed memory may stay "
                    "resident")
    return held


def give_back_free_pages() -> bool:
    """glibc's `malloc_trim(0)`: every whole free page inside the arenas (not only the heap's
    top) goes back to the system; True where some did. False where the C library is not glibc."""
    libc = _glibc()
    return libc is not None and libc.malloc_trim(0) == 1


async def _give_back_forever(every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        await asyncio.to_thread(give_back_free_pages)


def returning_free_pages(every_s: float = TRIM_EVERY_S) -> AsyncContextManager[None]:
    """`give_back_free_pages` every `every_s` seconds while the context is open."""
    return running(_give_back_forever(every_s), name="malloc-trim")
