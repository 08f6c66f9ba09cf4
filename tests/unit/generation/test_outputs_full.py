"""A full disk, injected at the write boundaries (ENOSPC from the output encoder; SQLITE_FULL
from a record store capped with `PRAGMA max_page_count`): the request fails `storage_full`
with a clear message, nothing it wrote remains, and held-back record changes are answered from
memory and written once there is room."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from tests.unit.generation.test_engine import Replies, drain, engine_for, media
from worldserve.api.jobs.ledger import JobLedger
from worldserve.api.jobs.records import JobRecord, JobStatus
from worldserve.engines.generation import engine as engine_module
from worldserve.errors import StorageFull
from worldserve.ipc.messages import ErrorReply, GenerationResult


@pytest.fixture(scope="module")
def engine(tiny_wan_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    eng = engine_for(tiny_wan_dir, tmp_path_factory.mktemp("out"))
    drain(eng)  # the background warmup step
    return eng


def test_second_output_on_a_full_disk_fails_the_request_and_removes_the_first(
        engine, monkeypatch: pytest.MonkeyPatch) -> None:
    real = engine_module.write_output
    calls: list[str] = []

    def fills_up(root: Path, name: str, *args, **kwargs) -> None:
        calls.append(name)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(root / f".{name}.p"))
        real(root, name, *args, **kwargs)

    monkeypatch.setattr(engine_module, "write_output", fills_up)
    replies = Replies()
    engine.submit(media("full", seeds=(1, 2)), replies.fn("full"))
    drain(engine)
    error = replies.terminal("full")
    assert isinstance(error, ErrorReply) and error.code == "storage_full"
    assert error.message.startswith("cannot write output full_1.png: the output directory's "
                                    "disk is full")
    assert not list(engine.output_dir.glob("*full*"))  # full_0.png was removed
    monkeypatch.setattr(engine_module, "write_output", real)
    engine.submit(media("room"), replies.fn("room"))
    drain(engine)
    assert isinstance(replies.terminal("room"), GenerationResult)


def _record(n: int) -> JobRecord:
    return JobRecord(id=f"job-{n}", kind="video", created_at=n, size="64x64",
                     revised_prompt="x" * 20_000)


def test_record_changes_a_full_disk_refuses_are_kept_then_written(tmp_path: Path) -> None:
    ledger = JobLedger(tmp_path, ttl_s=0, max_records=0)
    db = ledger.store._db
    first = _record(0)
    ledger.insert(first)
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count = {pages}")  # the file cannot grow: SQLITE_FULL
    with pytest.raises(StorageFull, match="disk is full"):
        ledger.insert(_record(1))
    assert ledger.store.get("job-1") is None  # refused whole

    first.revised_prompt = "y" * 200_000  # a change that needs new pages
    ledger.move(first, JobStatus.FAILED)  # held back, not raised
    assert ledger.get("job-0", "video").status == JobStatus.FAILED  # answered from memory
    assert ledger.store.get("job-0").status == JobStatus.QUEUED
    ledger.flush_unsaved()
    assert ledger.store.get("job-0").status == JobStatus.QUEUED  # still no room

    db.execute("PRAGMA max_page_count = 1073741823")
    ledger.flush_unsaved()
    assert ledger.store.get("job-0").status == JobStatus.FAILED
