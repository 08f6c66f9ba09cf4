"""`python -m tools.memtrace_diff DIR [--older I] [--newer J] [--by traceback|lineno]`: what
grew in the api between two of the tracemalloc snapshots that WORLDSERVE_TRACEMALLOC_DIR made
it write (worldserve/api/memtrace.py). Defaults: the middle snapshot against the last one, i.e.
the second half of the run, after start-up and warm-up have settled."""

from __future__ import annotations

import argparse
import tracemalloc
from pathlib import Path

from worldserve.api.memtrace import growth_report, snapshot_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--older", type=int, default=None, help="snapshot index (default: middle)")
    parser.add_argument("--newer", type=int, default=None, help="snapshot index (default: last)")
    parser.add_argument("--by", default="traceback", choices=("traceback", "lineno", "filename"))
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    last = len(sorted(args.folder.glob("snapshot-*.bin"))) - 1
    newer = last if args.newer is None else args.newer
    older = newer // 2 if args.older is None else args.older
    snapshots = [tracemalloc.Snapshot.load(str(snapshot_path(args.folder, i)))
                 for i in (older, newer)]
    print(f"snapshot {older} -> {newer}")
    print(growth_report(*snapshots, top_n=args.top, key_type=args.by), end="")


if __name__ == "__main__":
    main()
