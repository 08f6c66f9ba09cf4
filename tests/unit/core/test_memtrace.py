"""The api's opt-in allocation tracing (api/memtrace.py, WORLDSERVE_TRACEMALLOC_DIR)."""

from __future__ import annotations

import asyncio
import tracemalloc
from pathlib import Path

from starlette.testclient import TestClient

from worldserve.api.app import create_app
from worldserve.api.memtrace import growth_report, memory_tracing, snapshot_path
from worldserve.api.runtime import ServerRuntime
from worldserve.config import ServerConfig

HOARD: list[bytes] = []


def hoard(num_blocks: int) -> None:
    HOARD.extend(bytes(4096) for _ in range(num_blocks))


def test_the_report_names_the_site_that_grew() -> None:
    tracemalloc.start(4)
    try:
        before = tracemalloc.take_snapshot()
        hoard(200)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
        HOARD.clear()
    report = growth_report(before, after, top_n=1)
    assert "(+200 blocks)" in report
    assert "HOARD.extend(bytes(4096) for _ in range(num_blocks))" in report


def test_snapshots_and_growth_file_are_written_while_the_app_lives(tmp_path: Path) -> None:
    async def live_for(seconds: float) -> None:
        async with memory_tracing(tmp_path, every_s=0.05):
            await asyncio.sleep(seconds)
            assert tracemalloc.is_tracing()
        assert not tracemalloc.is_tracing()  # stopped with the app: no cost after

    asyncio.run(live_for(1.0))
    assert snapshot_path(tmp_path, 2).is_file()
    assert (tmp_path / "growth.txt").read_text().startswith("snapshot ")


def test_off_by_default(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("WORLDSERVE_TRACEMALLOC_DIR", raising=False)
    with TestClient(create_app(ServerRuntime(config=ServerConfig(), clients={}))) as http:
        assert http.get("/v1/health/live").status_code == 200
        assert not tracemalloc.is_tracing()
    monkeypatch.setenv("WORLDSERVE_TRACEMALLOC_DIR", str(tmp_path))
    with TestClient(create_app(ServerRuntime(config=ServerConfig(), clients={}))) as http:
        assert http.get("/v1/health/live").status_code == 200
        assert tracemalloc.is_tracing()
    assert not tracemalloc.is_tracing()


def test_the_tracers_own_allocations_are_left_out_whichever_checkout_reads_them() -> None:
    """The report's own source lines (linecache) grow the traced heap by megabytes; a snapshot
    read by another checkout's tools.memtrace_diff names this module by the api's path."""
    def trace(size: int, *frames: tuple[str, int]) -> tuple:
        return (0, size, frames, len(frames))

    older = tracemalloc.Snapshot([], 4)
    newer = tracemalloc.Snapshot([
        trace(1 << 20, ("/usr/lib/python3.11/linecache.py", 137),
              ("/srv/other-checkout/worldserve/api/memtrace.py", 49)),
        trace(4096, ("/srv/other-checkout/worldserve/api/jobs/ledger.py", 241)),
    ], 4)
    report = growth_report(older, newer)
    assert report.startswith("total growth +4.0 KiB over 1 sites"), report
    assert "ledger.py" in report and "memtrace.py" not in report
