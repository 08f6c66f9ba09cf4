"""The api's malloc thresholds (worldserve/api/allocator.py), observed in a fresh process: after
one large block is freed, glibc's own adjustment puts later megabyte blocks on the main arena's
heap and keeps megabytes freed at the heap's top resident; with the thresholds held, megabyte
blocks keep their own mappings and the freed top goes back to the system."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

from tests.support.machine import missing
from tests.support.server import REPO_ROOT

PROBE = """
import ctypes, json, sys
from worldserve.api.allocator import hold_malloc_thresholds

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = MallInfo2
held = hold_malloc_thresholds() if sys.argv[1] == "held" else None
libc.free(libc.malloc(4 << 20))  # glibc would now raise its mmap threshold to 4 MiB
blocks = [libc.malloc(1 << 20) for _ in range(8)]
info = libc.mallinfo2()
small = [libc.malloc(64 << 10) for _ in range(48)]  # 3 MiB below either mmap threshold: heap
for block in reversed(small):
    libc.free(block)
print(json.dumps({"held": held, "mmapped_bytes": info.hblkhd, "heap_bytes": info.arena,
                  "top_free_bytes": libc.mallinfo2().keepcost}))
"""


def probe(arm: str, script: str = PROBE) -> dict[str, int]:
    """`script`'s JSON line, run in a fresh interpreter (whose malloc no test has touched)."""
    done = subprocess.run([sys.executable, "-c", script, arm], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout)


def test_held_thresholds_keep_megabyte_blocks_off_the_heap() -> None:
    if platform.libc_ver()[0] != "glibc":
        missing("the C library is not glibc (the thresholds held are glibc's)")
    adjusted, held = probe("glibc"), probe("held")
    assert held["held"] is True
    eight_mib = 8 << 20
    assert adjusted["mmapped_bytes"] < eight_mib <= adjusted["heap_bytes"], adjusted
    assert held["mmapped_bytes"] >= eight_mib > held["heap_bytes"], held


def test_held_thresholds_give_a_freed_heap_top_back() -> None:
    if platform.libc_ver()[0] != "glibc":
        missing("the C library is not glibc (the thresholds held are glibc's)")
    adjusted, held = probe("glibc"), probe("held")
    assert adjusted["top_free_bytes"] >= 3 << 20, adjusted  # trim threshold raised to 8 MiB
    assert held["top_free_bytes"] < 2 * (128 << 10), held  # trimmed past 128 KiB


FREED_INSIDE = """
import asyncio, contextlib, ctypes, json, os, sys
from worldserve.api.allocator import hold_malloc_thresholds, returning_free_pages

def resident_kib():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
hold_malloc_thresholds()
blocks = [libc.malloc(32 << 10) for _ in range(2048)]  # 64 MiB of heap blocks, touched
for block in blocks:
    ctypes.memset(block, 1, 32 << 10)
for block in blocks[:-1]:  # the last one holds the heap's top: nothing there to trim
    libc.free(block)
before = resident_kib()

async def live(every_s):
    async with returning_free_pages(every_s) if every_s else contextlib.nullcontext():
        await asyncio.sleep(0.5)

asyncio.run(live(float(sys.argv[1])))
print(json.dumps({"before_kib": before, "after_kib": resident_kib()}))
"""


def test_free_pages_inside_the_heap_go_back_while_the_api_lives() -> None:
    """64 MiB freed below a live block stays resident (glibc trims only the heap's top) until
    the lifespan's periodic malloc_trim hands its pages back."""
    if platform.libc_ver()[0] != "glibc":
        missing("the C library is not glibc (malloc_trim is glibc's)")
    kept, returned = probe("0", FREED_INSIDE), probe("0.05", FREED_INSIDE)
    assert kept["before_kib"] - kept["after_kib"] < 8 << 10, kept
    assert returned["before_kib"] - returned["after_kib"] > 48 << 10, returned
