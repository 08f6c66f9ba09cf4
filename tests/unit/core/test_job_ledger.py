"""JobRecord and JobLedger without a server: the status machine, orphan files, restart recovery,
and records written by the dict-based store of earlier versions."""

from __future__ import annotations

import json
import re
import tracemalloc
from pathlib import Path

import pytest

from worldserve.api.jobs.ledger import JobLedger
from worldserve.api.jobs.params import MediaRequest
from worldserve.api.jobs.records import JobError, JobRecord, JobStatus
from worldserve.errors import InternalError, InvalidRequest, RequestTimeout
from worldserve.ipc.messages import GenerationParams, GenerationResult

# A record as the dict-based MediaService stored it (keys and value shapes of that version).
OLD_RECORD = {"id": "c0ffee", "_kind": "video", "status": "in_progress", "progress": 40,
              "created_at": 1700000000, "completed_at": None, "expires_at": None, "error": None,
              "size": "64x64", "num_outputs": 1, "file_names": [], "revised_prompt": "a cube",
              "output_format": "mp4", "model": "sora-2", "stage_request_id": "gen-1",
              "num_frames": 9, "seconds": "1", "_seq": 3}


def resolved() -> MediaRequest:
    params = GenerationParams(prompt="a cube", width=64, height=32, num_frames=9,
                              num_inference_steps=2, guidance_scale=1.0, seeds=[1, 2])
    return MediaRequest(params=params, output_format="mp4", compression=50)


def result(*names: str) -> GenerationResult:
    return GenerationResult(request_id="gen-1", file_names=list(names), width=64, height=32,
                            num_frames=9, inference_time_s=0.5)


@pytest.fixture
def ledger(tmp_path: Path) -> JobLedger:
    return JobLedger(tmp_path / "out", ttl_s=60, max_records=0)


def test_terminal_states_are_final_and_stamp_expiry(ledger: JobLedger) -> None:
    record = ledger.new("video", resolved())
    assert (record.status, record.size, record.num_outputs) == (JobStatus.QUEUED, "64x32", 2)
    ledger.insert(record)
    ledger.progress(record, 30)
    assert record.status == JobStatus.IN_PROGRESS and record.progress == 30
    ledger.progress(record, 10)  # progress never goes back
    assert record.progress == 30
    assert ledger.cancel(record, "job deleted")
    assert record.completed_at is not None and record.expires_at == record.completed_at + 60
    assert not ledger.move(record, JobStatus.COMPLETED)  # a late result changes nothing
    stored = ledger.get(record.id, "video")
    assert stored is not None and stored.status == JobStatus.CANCELLED
    assert stored.error == JobError("job deleted", "cancelled")


def test_a_result_after_cancel_deletes_the_orphan_files(ledger: JobLedger) -> None:
    record = ledger.new("video", resolved())
    ledger.insert(record)
    ledger.cancel(record, "job deleted")
    orphan = ledger.output_dir / f"{record.id}.mp4"
    orphan.write_bytes(b"x")
    ledger.complete(record, result(orphan.name))
    assert not orphan.exists() and record.status == JobStatus.CANCELLED


def test_failures_show_public_codes_only(ledger: JobLedger) -> None:
    first, second = ledger.new("video", resolved()), ledger.new("video", resolved())
    for record in (first, second):
        ledger.insert(record)
    ledger.fail(first, RequestTimeout("too slow"))
    ledger.fail(second, InvalidRequest("bad"))
    assert first.error == JobError("too slow", "timeout")
    assert second.error == JobError("bad", "invalid_request")
    third = ledger.new("video", resolved())
    ledger.insert(third)
    ledger.fail(third, InternalError("boom"))
    assert third.error == JobError("boom", "generation_failed")


def test_records_of_earlier_versions_load_and_recover(tmp_path: Path) -> None:
    record = JobRecord.from_json(json.dumps(OLD_RECORD))
    assert (record.kind, record.seq, record.status) == ("video", 3, JobStatus.IN_PROGRESS)
    assert json.loads(record.to_json()) == {**OLD_RECORD, "num_input_images": 0,
                                            "response_format": None, "inference_time_s": None,
                                            "peak_memory_mb": None, "action": None,
                                            "stage_durations": {}, "step_cache": None}
    ledger = JobLedger(tmp_path / "out", ttl_s=0, max_records=0)
    ledger.insert(record)
    restarted = JobLedger(tmp_path / "out", ttl_s=0, max_records=0)
    restarted.recover()
    recovered = restarted.get("c0ffee", "video")
    assert recovered is not None and recovered.status == JobStatus.FAILED
    assert recovered.error == JobError("server restarted before the job finished",
                                       "server_restart")


def test_removing_records_holds_no_memory_per_record(ledger: JobLedger) -> None:
    """Retention removes thousands of records in a soak: a removal must leave nothing behind in
    process-wide caches. (A `glob` pattern unique to each job compiled one regex per removal
    into `re`'s 512-entry cache: about 0.9 KiB each, the api's growth in a soak.)"""
    def churn(num_records: int) -> None:
        for _ in range(num_records):
            record = ledger.new("video", resolved())
            ledger.insert(record)
            ledger.cancel(record, "job deleted")
            ledger.remove(record)

    churn(20)  # warm-up: sqlite's statement cache, lazy imports
    re.purge()  # an empty cache, whatever other tests left in it, so that growth would show
    tracemalloc.start()
    try:
        churn(20)
        before_bytes = tracemalloc.get_traced_memory()[0]
        churn(600)
        grown_bytes = tracemalloc.get_traced_memory()[0] - before_bytes
    finally:
        tracemalloc.stop()
    assert grown_bytes < 64 * 1024, f"{grown_bytes} bytes held after 600 removals"


def test_remove_deletes_the_records_partial_outputs_only(ledger: JobLedger) -> None:
    mine, other = ledger.new("video", resolved()), ledger.new("video", resolved())
    for record in (mine, other):
        ledger.insert(record)
        (ledger.output_dir / f".{record.id}.mp4.partial").write_bytes(b"half")
    assert ledger.remove(mine) == 1
    assert not (ledger.output_dir / f".{mine.id}.mp4.partial").exists()
    assert (ledger.output_dir / f".{other.id}.mp4.partial").exists()
