"""Opt-in allocation tracing of the api process, to find what grows during a soak.

With WORLDSERVE_TRACEMALLOC_DIR set (envs.py), the app's lifespan starts tracemalloc and takes a
snapshot every WORLDSERVE_TRACEMALLOC_EVERY_S seconds: each is dumped to `snapshot-NNNN.bin`
(`tracemalloc.Snapshot.load` reads it back for any other comparison), and `growth.txt` is
rewritten with the top growth by traceback between the snapshot half-way through the run so far
and the newest one, i.e. what grew over the second half, where start-up noise has settled.
Off by default: tracing slows down every allocation of the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tracemalloc
from pathlib import Path
from typing import AsyncIterator

from worldserve.api.background import running

log = logging.getLogger("worldserve.api")

TRACE_FRAMES = 12  # deep enough to see past asyncio and starlette into worldserve's frames
TOP_N = 25
# tracemalloc's own bookkeeping, the import machinery and this module (its reports fill
# linecache) are not the server's growth.
IGNORED = (tracemalloc.__file__, "<frozen importlib._bootstrap>",
           "<frozen importlib._bootstrap_external>")
# This module by pattern, not by __file__: a snapshot is often read by another checkout's copy
# (tools.memtrace_diff), whose __file__ is not the path in the snapshot's frames.
THIS_MODULE = "*/worldserve/api/memtrace.py"


def snapshot_path(folder: Path, index: int) -> Path:
    return folder / f"snapshot-{index:04d}.bin"


def growth_report(older: tracemalloc.Snapshot, newer: tracemalloc.Snapshot,
                  top_n: int = TOP_N, key_type: str = "traceback") -> str:
    """The `top_n` allocation sites (grouped by `key_type`: traceback, lineno or filename)
    whose live bytes grew most from `older` to `newer`, biggest first, each with its size and
    count change and its frames (innermost last)."""
    ignore = [tracemalloc.Filter(False, name) for name in IGNORED]
    ignore.append(tracemalloc.Filter(False, THIS_MODULE, all_frames=True))
    diffs = newer.filter_traces(ignore).compare_to(older.filter_traces(ignore), key_type)
    total = sum(d.size_diff for d in diffs)
    lines = [f"total growth {total / 1024:+.1f} KiB over {len(diffs)} sites ({key_type}); "
             f"live now {sum(d.size for d in diffs) / 1024:.1f} KiB"]
    for diff in diffs[:top_n]:
        lines.append(f"\n{diff.size_diff / 1024:+.1f} KiB ({diff.count_diff:+d} blocks), "
                     f"now {diff.size / 1024:.1f} KiB in {diff.count} blocks")
        lines.extend(f"    {line}" for line in diff.traceback.format())
    return "\n".join(lines) + "\n"


def write_atomic(path: Path, text: str) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(text)
    os.replace(partial, path)


def take_snapshot(folder: Path, index: int) -> None:
    """Dump snapshot `index` and, from the third on, the second-half growth report."""
    tracemalloc.take_snapshot().dump(str(snapshot_path(folder, index)))
    if index < 2:
        return
    older = tracemalloc.Snapshot.load(str(snapshot_path(folder, index // 2)))
    newer = tracemalloc.Snapshot.load(str(snapshot_path(folder, index)))
    header = f"snapshot {index // 2} -> {index}\n"
    write_atomic(folder / "growth.txt", header + growth_report(older, newer))


async def trace_memory(folder: Path, every_s: float) -> None:
    """Snapshot every `every_s` until cancelled (the files are written off the event loop)."""
    folder.mkdir(parents=True, exist_ok=True)
    tracemalloc.start(TRACE_FRAMES)
    log.warning("tracemalloc on: snapshots every %.0f s in %s", every_s, folder)
    try:
        for index in range(10**9):
            await asyncio.to_thread(take_snapshot, folder, index)
            await asyncio.sleep(every_s)
    finally:
        tracemalloc.stop()


@contextlib.asynccontextmanager
async def memory_tracing(folder: Path | None, every_s: float) -> AsyncIterator[None]:
    """Runs `trace_memory` for the app's life when `folder` is set; nothing otherwise."""
    if folder is None:
        yield
        return
    async with running(trace_memory(folder, every_s), name="memtrace"):
        yield
