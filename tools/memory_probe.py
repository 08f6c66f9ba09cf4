"""`python -m tools.memory_probe PID [--every-s 30] [--allocators [--no-trim]]`: where a
process's RSS lies, sampled from outside while it runs (the api during a soak: `ps` shows it as
the `worldserve serve` child of benchmarks/soak.py).

Each sample is one JSON line: RSS by mapping (`[heap]`, glibc's main arena grown by brk;
`[anon]`, anonymous mmaps: CPython's 1 MiB object arenas, other arenas and large blocks;
`[so]`, shared libraries paged in; files), and with `--allocators` what the two allocators
inside say, read through gdb (on the machine, ptrace allowed): CPython's own statistics
(`sys._debugmallocstats`: bytes in allocated blocks are live small objects, whatever
tracemalloc saw), glibc's `malloc_info` (per arena: bytes from the system and bytes free in
it) and the RSS that `malloc_trim(0)` gives back (`--no-trim`: no trim, so the curve is the
process's own). tracemalloc (worldserve/api/memtrace.py) only sees Python allocations made
after it started; this sees the rest. gdb stops the process for about a second per probe, and
the trim changes what it measures: probe rarely.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

MAPPING = re.compile(r"^[0-9a-f]+-[0-9a-f]+ ")


def rss_by_mapping(pid: int) -> dict[str, int]:
    """RSS in KiB by kind of mapping, from /proc/PID/smaps."""
    rss: collections.Counter[str] = collections.Counter()
    kind = "[anon]"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        if MAPPING.match(line):
            fields = line.split()
            name = fields[5] if len(fields) > 5 else "[anon]"
            kind = "[so]" if ".so" in name else name
        elif line.startswith("Rss:"):
            rss[kind] += int(line.split()[1])
    return dict(rss)


def _gdb(pid: int, *commands: str) -> str:
    args = ["gdb", "-p", str(pid), "-batch", "-nx"]
    for command in commands:
        args += ["-ex", command]
    return subprocess.run(args, capture_output=True, text=True, timeout=60).stdout


def glibc_arenas(xml_path: Path) -> dict[str, int]:
    """`malloc_info`'s totals in KiB: from the system, free inside, and mmapped blocks."""
    root = ET.parse(xml_path).getroot()
    totals = {t.get("type"): int(t.get("size") or 0) for t in root.findall("total")}
    system = {s.get("type"): int(s.get("size") or 0) for s in root.findall("system")}
    return {"system_kib": system.get("current", 0) // 1024,
            "free_kib": (totals.get("fast", 0) + totals.get("rest", 0)) // 1024,
            "mmap_kib": totals.get("mmap", 0) // 1024, "arenas": len(root.findall("heap"))}


def allocators(pid: int, trim: bool = True) -> dict[str, object]:
    """CPython's live small-object bytes and object arenas (in the process's own stderr),
    glibc's arenas, and with `trim` the arenas after `malloc_trim(0)` and the RSS it gave back
    (without: the process is left as it was, so a curve over a run is its own)."""
    with tempfile.TemporaryDirectory(prefix="memory-probe-") as scratch:
        before, after = Path(scratch) / "before.xml", Path(scratch) / "after.xml"
        stats = Path(scratch) / "pymalloc.txt"
        rss_before = rss_kib(pid)
        _gdb(pid, "call (int) PyGILState_Ensure()",
             f'call (int) PyRun_SimpleString("import os, sys; f = open({str(stats)!r}, \'w\'); '
             f'os.dup2(f.fileno(), 99); e = os.dup(2); os.dup2(99, 2); '
             f'sys._debugmallocstats(); os.dup2(e, 2); os.close(e); os.close(99); f.close()")',
             "call (void) PyGILState_Release($1)")
        info = [f'call (void*) fopen("{before}", "w")', "call (int) malloc_info(0, $1)",
                "call (int) fclose($1)"]
        if trim:
            info += ["call (int) malloc_trim(0)", f'call (void*) fopen("{after}", "w")',
                     "call (int) malloc_info(0, $5)", "call (int) fclose($5)"]
        _gdb(pid, *info)
        text = stats.read_text()
        live = re.search(r"bytes in allocated blocks\s*=\s*([\d,]+)", text)
        arenas = re.search(r"# arenas allocated current\s*=\s*([\d,]+)", text)
        out: dict[str, object] = {
            "pymalloc_live_kib": int(live.group(1).replace(",", "")) // 1024 if live else None,
            "pymalloc_arenas": int(arenas.group(1).replace(",", "")) if arenas else None,
            "glibc_before_trim" if trim else "glibc": glibc_arenas(before)}
        if trim:
            out["glibc_after_trim"] = glibc_arenas(after)
            out["trim_gave_back_kib"] = rss_before - rss_kib(pid)
        return out


def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s*(\d+)", status).group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pid", type=int)
    parser.add_argument("--every-s", type=float, default=30.0)
    parser.add_argument("--allocators", action="store_true",
                        help="also probe the allocators through gdb (every 10th sample)")
    parser.add_argument("--no-trim", action="store_true",
                        help="with --allocators: read glibc's arenas without malloc_trim(0), "
                             "leaving the process as it was")
    args = parser.parse_args()
    start = time.monotonic()
    for index in range(10**9):
        try:
            sample: dict[str, object] = {"t_s": round(time.monotonic() - start),
                                         "rss_kib": rss_kib(args.pid),
                                         "by_mapping_kib": rss_by_mapping(args.pid)}
            if args.allocators and index % 10 == 0:
                sample.update(allocators(args.pid, trim=not args.no_trim))
        except FileNotFoundError:
            return  # the process is gone
        print(json.dumps(sample), flush=True)
        time.sleep(args.every_s)


if __name__ == "__main__":
    main()
