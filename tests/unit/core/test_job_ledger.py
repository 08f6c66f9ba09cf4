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
from worldserve.ipc.messages import GenerationParams, GenerationProgress, GenerationResult

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


def update(progress: int, phase: str, queue_position: int | None = None,
           step: int = 0) -> GenerationProgress:
    return GenerationProgress(request_id="gen-1", progress=progress, steps_done=step,
                              steps_total=4, phase=phase, queue_position=queue_position)


@pytest.fixture
def ledger(tmp_path: Path) -> JobLedger:
    return JobLedger(tmp_path / "out", ttl_s=60, max_records=0)


def test_terminal_states_are_final_and_stamp_expiry(ledger: JobLedger) -> None:
    record = ledger.new("video", resolved())
    assert (record.status, record.size, record.num_outputs) == (JobStatus.QUEUED, "64x32", 2)
    ledger.insert(record)
    ledger.progress(record, update(30, "denoise"))
    assert record.status == JobStatus.IN_PROGRESS and record.progress == 30
    ledger.progress(record, update(10, "denoise"))  # progress never goes back
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
                                            "stage_durations": {}, "step_cache": None,
                                            "queue_position": None, "phase": None, "step": 0,
                                            "total_steps": 0, "queue_wait_s": None,
                                            "remixed_from_video_id": None}
    ledger = JobLedger(tmp_path / "out", ttl_s=0, max_records=0)
    ledger.insert(record)
    restarted = JobLedger(tmp_path / "out", ttl_s=0, max_records=0)
    restarted.recover()
    recovered = restarted.get("c0ffee", "video")
    assert recovered is not None and recovered.status == JobStatus.FAILED
    assert recovered.error == JobError("server restarted before the job finished",
                                       "server_restart")


def test_queued_until_the_engine_admits_the_job(ledger: JobLedger) -> None:
    record = ledger.new("video", resolved())
    ledger.insert(record)
    assert ledger.progress(record, update(0, "queued", queue_position=2)) is None
    assert ledger.progress(record, update(0, "queued", queue_position=1)) is None
    assert (record.status, record.queue_position) == (JobStatus.QUEUED, 1)
    assert [kind for kind, _ in ledger.queue_waits_s()] == ["video"]
    waited_s = ledger.progress(record, update(0, "encode"))
    assert waited_s is not None and waited_s >= 0 and record.queue_wait_s == round(waited_s, 6)
    assert (record.status, record.phase, record.queue_position) == (
        JobStatus.IN_PROGRESS, "encode", None)
    assert ledger.queue_waits_s() == [] and record.id in ledger.unfinished
    assert ledger.progress(record, update(45, "denoise", step=2)) is None
    assert (record.progress, record.step, record.total_steps) == (45, 2, 4)
    ledger.progress(record, update(0, "queued", queue_position=0))  # late: changes nothing
    assert record.queue_position is None and record.status == JobStatus.IN_PROGRESS
    ledger.cancel(record, "job deleted")
    assert record.id not in ledger.unfinished


def completed(ledger: JobLedger) -> JobRecord:
    record = ledger.new("video", resolved())
    ledger.insert(record)
    (ledger.output_dir / f"{record.id}.mp4").write_bytes(b"x")
    ledger.complete(record, result(f"{record.id}.mp4"))
    return record


def test_an_expired_job_is_gone_and_its_404_says_expired(tmp_path: Path, monkeypatch) -> None:
    ledger = JobLedger(tmp_path / "out", ttl_s=0.5, max_records=0)
    record = completed(ledger)
    assert record.expires_at == record.completed_at + 1  # a fractional TTL rounds up, not to 0
    assert ledger.get(record.id, "video") is not None
    monkeypatch.setattr("worldserve.api.jobs.ledger.now_s", lambda: record.expires_at)
    assert ledger.get(record.id, "video") is None  # expired: gone before the sweep runs
    before_sweep = ledger.missing(record.id, "video", "Video not found")
    assert before_sweep.code == "expired" and "output_ttl_s=0.5" in before_sweep.message
    assert ledger.prune()["ids"] == [record.id]
    assert not ledger.paths(record)[0].exists()
    after_sweep = ledger.missing(record.id, "video", "Video not found")
    assert (after_sweep.code, after_sweep.param) == ("expired", "video_id")
    assert ledger.missing("other", "video", "Video not found").code == "not_found"


def test_a_completed_job_whose_files_vanished_is_gone(ledger: JobLedger) -> None:
    record = completed(ledger)
    kept = completed(ledger)
    ledger.paths(record)[0].unlink()  # an operator's clean-up, behind the server's back
    listed, _ = ledger.page("video", None, 10, False)
    assert [r.id for r in listed] == [kept.id]
    assert ledger.get(record.id, "video") is None
    assert ledger.missing(record.id, "video", "Video not found").code == "expired"
    assert ledger.get(kept.id, "video") is not None


def test_tombstones_are_bounded_and_outlive_a_restart(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("worldserve.api.jobs.ledger.MAX_REMEMBERED_EXPIRIES", 3)
    ledger = JobLedger(tmp_path / "out", ttl_s=60, max_records=0)
    records = [completed(ledger) for _ in range(5)]
    monkeypatch.setattr("worldserve.api.jobs.ledger.now_s", lambda: records[-1].expires_at)
    assert ledger.prune()["ids"] == [r.id for r in records]  # oldest first
    ledger.store.close()
    reopened = JobLedger(tmp_path / "out", ttl_s=60, max_records=0)
    codes = [reopened.missing(r.id, "video", "Video not found").code for r in records]
    assert codes == ["not_found"] * 2 + ["expired"] * 3  # the newest 3 tombstones are kept
    assert "expired at" in reopened.missing(records[-1].id, "video", "").message


@pytest.mark.parametrize("route", ["deleted", "expired"])
def test_removing_records_holds_no_memory_per_record(ledger: JobLedger, monkeypatch,
                                                     route: str) -> None:
    """Retention removes thousands of records in a soak: a removal must leave nothing behind in
    process-wide caches or the ledger. (A `glob` pattern unique to each job compiled one regex
    per removal into `re`'s 512-entry cache: about 0.9 KiB each; the reasons of expired
    records, kept in memory for their late 404s, held about 0.2 KiB each.)"""
    monkeypatch.setattr("worldserve.api.jobs.ledger.now_s", lambda: 1_800_000_000)

    def churn(num_records: int) -> None:
        for _ in range(num_records):
            record = ledger.new("video", resolved())
            ledger.insert(record)
            ledger.cancel(record, "job deleted")
            if route == "deleted":
                ledger.remove(record)
            else:
                record.expires_at = record.completed_at  # due now: the sweep removes it
                ledger.store.save(record)
                assert ledger.prune()["ids"] == [record.id]

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


def test_a_tombstone_and_its_trim_commit_as_one_transaction(tmp_path: Path) -> None:
    """Retention writes a tombstone about once a second in a soak: the insert and the trim of
    the oldest go to the WAL together, and a failure in either leaves neither."""
    store = JobLedger(tmp_path / "out", ttl_s=60, max_records=0).store
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    store.remember_gone("a", "expired", keep=1)
    store.remember_gone("b", "expired", keep=1)
    assert [s.split()[0] for s in statements] == ["BEGIN", "INSERT", "DELETE", "COMMIT"] * 2
    assert (store.why_gone("a"), store.why_gone("b")) == (None, "expired")

    store._db.execute("CREATE TRIGGER refuse BEFORE DELETE ON gone "
                      "BEGIN SELECT RAISE(ABORT, 'trim refused'); END")
    with pytest.raises(Exception, match="trim refused"):
        store.remember_gone("c", "expired", keep=1)
    assert (store.why_gone("b"), store.why_gone("c")) == ("expired", None)
    assert not store._db.in_transaction
