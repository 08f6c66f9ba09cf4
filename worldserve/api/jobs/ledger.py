"""`JobLedger`: job records and their files: status changes, retention, restart recovery.

Every status change goes through `move()`, which refuses illegal transitions (terminal states
are final, so a late stage reply changes nothing), stamps completion and expiry, writes the
record and logs one line (created, started, completed in N s, failed: reason, cancelled).
Progress within `in_progress` is written at most every `PROGRESS_WRITE_INTERVAL_S` (the relay
holds the live record in memory; the store is the durable copy). Retention (spec
native-media.md §9): restart recovery, TTL and max-records pruning, a sweeper, and file deletion
with the record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec

from worldserve.api.jobs.params import MediaRequest
from worldserve.api.jobs.records import (
    LIVE_STATUSES,
    JobError,
    JobKind,
    JobRecord,
    JobStatus,
)
from worldserve.api.jobs.store import RecordStore
from worldserve.api.jobs.world_actions import predicted_action
from worldserve.errors import Expired, NotFound, StorageFull, WorldserveError, public_message
from worldserve.ipc.messages import GenerationProgress, GenerationResult

log = logging.getLogger("worldserve.jobs")

SWEEP_INTERVAL_S = 60.0
MAX_REMEMBERED_EXPIRIES = 4096  # ids whose 404 still says `expired` after their record went
PROGRESS_WRITE_INTERVAL_S = 1.0
RECORDS_FILE = Path(".worldserve") / "records.sqlite3"
# Stage error codes a job shows as they are; anything else is `generation_failed`.
_PUBLIC_ERROR_CODES = ("invalid_request", "stage_unavailable", "timeout", "replica_lost",
                       "storage_full")


def now_s() -> int:
    return int(time.time())


class JobLedger:
    def __init__(self, output_dir: Path, ttl_s: float, max_records: int,
                 id_tag: str = "") -> None:
        self.output_dir = output_dir
        self.id_tag = id_tag
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.store = RecordStore(output_dir / RECORDS_FILE)
        self.ttl_s = ttl_s
        self.max_records = max_records
        self._sweeper: asyncio.Task[None] | None = None
        self._inserted_s: dict[str, float] = {}  # monotonic insert time of each live record
        self._written_s: dict[str, float] = {}  # when each live record was last written
        self.unfinished: dict[str, JobRecord] = {}  # queued and in-progress records (/metrics)
        # Changes a full disk kept out of the store: answered from here, written once there
        # is room again (the sweeper retries each pass).
        self._unsaved: dict[str, JobRecord] = {}

    # ------------------------------------------------------------------ records

    def new(self, kind: JobKind, request: MediaRequest, **fields: Any) -> JobRecord:
        p = request.params
        return JobRecord(id=f"{uuid.uuid4()}{self.id_tag}", kind=kind, created_at=now_s(),
                         size=f"{p.width}x{p.height}", num_outputs=len(p.seeds),
                         revised_prompt=p.prompt, output_format=request.output_format, **fields)

    def insert(self, record: JobRecord) -> None:
        self.store.insert(record)
        self._inserted_s[record.id] = self._written_s[record.id] = time.monotonic()
        if record.status.is_live:
            self.unfinished[record.id] = record
        frames = f", {record.num_frames} frames" if record.num_frames else ""
        log.info("job %s (%s) created: %s%s, %d output(s), %s", record.id, record.kind,
                 record.size, frames, record.num_outputs, record.status.value)

    def page(self, kind: JobKind, after: str | None, limit: int,
             descending: bool) -> tuple[list[JobRecord], bool]:
        """Unexpired records of `kind` after record `after`; True when more follow."""
        records, has_more = self.store.page(kind, after, limit, descending, now_s())
        return [r for r in records if not self._drop_if_vanished(r)], has_more

    def position(self, record_id: str, kind: JobKind) -> tuple[int, int] | None:
        """(created_at, seq) of a record, expired or not (as `page`'s anchor)."""
        return self.store.position(record_id, kind)

    def page_after(self, kind: JobKind, anchor: tuple[int, int] | None, limit: int,
                   descending: bool) -> tuple[list[JobRecord], bool]:
        """Unexpired records of `kind` after position `anchor` ((created_at, seq))."""
        records, has_more = self.store.page_after(kind, anchor, limit, descending, now_s())
        return [r for r in records if not self._drop_if_vanished(r)], has_more

    def get(self, record_id: str, kind: JobKind) -> JobRecord | None:
        """The live (unexpired) record of `kind`, or None (`missing` says why)."""
        record = self._unsaved.get(record_id)
        if record is None or record.kind != kind:
            record = self.store.get(record_id, kind)
        if record is None or _expired(record) or self._drop_if_vanished(record):
            return None
        return record

    def missing(self, record_id: str, kind: JobKind, message: str) -> NotFound:
        """The 404 for a record `get` did not return: `expired` (naming when, or that its files
        were removed) while the server remembers it, else `message`."""
        record = self.store.get(record_id, kind)
        if record is not None and _expired(record):
            return Expired(f"{kind} {record_id} expired at {record.expires_at} (output_ttl_s="
                           f"{self.ttl_s:g}); its outputs are deleted", param=f"{kind}_id")
        why = self.store.why_gone(record_id)
        if why is not None:
            return Expired(f"{kind} {record_id} {why}", param=f"{kind}_id")
        return NotFound(message, param=f"{kind}_id")

    def _drop_if_vanished(self, record: JobRecord) -> bool:
        """A completed record whose files were removed behind the server's back (an operator's
        clean-up) is gone too, never `completed` with a 404 content: True when it was."""
        if record.status != JobStatus.COMPLETED or all(p.is_file() for p in self.paths(record)):
            return False
        log.warning("job %s: its output files were removed; the job is gone", record.id)
        self.remove(record)
        self._remember_gone(record.id, "expired: its output files were removed")
        return True

    def _remember_gone(self, record_id: str, why: str) -> None:
        """Keep why a removed record went (expired at / files removed) for its late 404s; on a
        full disk the tombstone is skipped (that 404 then says only `not found`)."""
        with contextlib.suppress(StorageFull):
            self.store.remember_gone(record_id, why, keep=MAX_REMEMBERED_EXPIRIES)

    def move(self, record: JobRecord, status: JobStatus, **changes: Any) -> bool:
        if not record.status.can_move_to(status):
            return False
        record.status = status
        if not status.is_live:
            self.unfinished.pop(record.id, None)
        for name, value in changes.items():
            setattr(record, name, value)
        if not status.is_live:
            record.completed_at = now_s()
            if self.ttl_s > 0:  # never before the TTL (0.5 s is 1 s, not 0)
                record.expires_at = record.completed_at + math.ceil(self.ttl_s)
        self._write(record)
        self._log_move(record)
        return True

    def _write(self, record: JobRecord) -> None:
        try:
            self.store.save(record)
        except StorageFull as exc:
            if record.id not in self._unsaved:
                log.error("job %s (%s): %s; kept in memory until there is room", record.id,
                          record.status.value, exc.message)
            self._unsaved[record.id] = record
        else:
            self._unsaved.pop(record.id, None)
        if record.status.is_live:
            self._written_s[record.id] = time.monotonic()
        else:
            self._written_s.pop(record.id, None)

    def _log_move(self, record: JobRecord) -> None:
        inserted = (self._inserted_s.pop(record.id, None) if not record.status.is_live
                    else self._inserted_s.get(record.id))
        after = f" after {time.monotonic() - inserted:.2f} s" if inserted is not None else ""
        if record.status == JobStatus.IN_PROGRESS:
            log.info("job %s started%s", record.id, after)
        elif record.status == JobStatus.COMPLETED:
            log.info("job %s completed%s (inference %s s)", record.id, after,
                     f"{record.inference_time_s:.2f}" if record.inference_time_s else "-")
        else:
            error = record.error
            log.info("job %s %s%s: %s (%s)", record.id, record.status.value, after,
                     error.message if error else "-", error.code if error else "-")

    def queue_waits_s(self) -> list[tuple[JobKind, float]]:
        """(kind, seconds waited so far) of every job the engine has not admitted yet."""
        now = time.monotonic()
        return [(record.kind, now - self._inserted_s.get(record_id, now))
                for record_id, record in self.unfinished.items()
                if record.status == JobStatus.QUEUED]

    def cancel(self, record: JobRecord, message: str) -> bool:
        return self.move(record, JobStatus.CANCELLED, error=JobError(message, "cancelled"))

    def progress(self, record: JobRecord, update: GenerationProgress) -> float | None:
        """Apply the engine's progress reply. A `queued` one moves the queue position (kept in
        memory); the first other one is the engine admitting the job: `in_progress` from then,
        and its queue wait (seconds, returned; None for any other update) is recorded."""
        if update.phase == "queued":
            if record.status == JobStatus.QUEUED:
                record.queue_position = update.queue_position
            return None
        changes = dict(progress=max(record.progress, min(99, update.progress)),
                       phase=update.phase, step=update.steps_done,
                       total_steps=update.steps_total)
        if record.status == JobStatus.QUEUED:
            waited_s = time.monotonic() - self._inserted_s.get(record.id, time.monotonic())
            self.move(record, JobStatus.IN_PROGRESS, queue_position=None,
                      queue_wait_s=round(waited_s, 6), **changes)
            return waited_s
        if record.status == JobStatus.IN_PROGRESS:
            for name, value in changes.items():
                setattr(record, name, value)
            written = self._written_s.get(record.id, 0.0)
            if time.monotonic() - written >= PROGRESS_WRITE_INTERVAL_S:
                self._write(record)
        return None

    def complete(self, record: JobRecord, result: GenerationResult) -> None:
        predicted = predicted_action(result.actions[0]) if result.actions else None
        moved = self.move(record, JobStatus.COMPLETED, progress=100,
                          file_names=list(result.file_names),
                          inference_time_s=result.inference_time_s,
                          peak_memory_mb=result.peak_memory_mb or 0.0,
                          stage_durations=dict(result.stage_durations),
                          step_cache=(msgspec.to_builtins(result.step_cache)
                                      if result.step_cache is not None else None),
                          action=record.action or predicted,
                          size=f"{result.width}x{result.height}")
        if not moved:
            self._delete_files(result.file_names)  # cancelled meanwhile: the files are orphans

    def fail(self, record: JobRecord, exc: WorldserveError) -> None:
        code = exc.code if exc.code in _PUBLIC_ERROR_CODES else "generation_failed"
        self.move(record, JobStatus.FAILED, error=JobError(public_message(exc), code))

    # ------------------------------------------------------------------ files

    def paths(self, record: JobRecord) -> list[Path]:
        return [self.output_dir / name for name in record.file_names]

    def _delete_files(self, names: list[str]) -> int:
        removed = 0
        for name in names:
            for path in (self.output_dir / name, self.output_dir / f".{name}.partial"):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    removed += 1
        return removed

    def _partial_files(self, record: JobRecord) -> list[str]:
        """The outputs of `record` the stage left half-written (`.<name>.partial`). A scan with
        string tests, not `glob(f".{id}*.partial")`: a pattern unique to each job made every
        removal compile one into `re`'s and pathlib's process-wide caches (512 and 128
        entries), the api's main growth in a soak until they filled (docs/operations.md)."""
        prefix, suffix = f".{record.id}", ".partial"
        with contextlib.suppress(FileNotFoundError), os.scandir(self.output_dir) as entries:
            return [entry.name[1:-len(suffix)] for entry in entries
                    if entry.name.startswith(prefix) and entry.name.endswith(suffix)]
        return []

    def remove(self, record: JobRecord) -> int:
        """Delete a record and every file it owns (outputs and partial outputs)."""
        removed = self._delete_files(record.file_names + self._partial_files(record))
        self.store.delete(record.id)
        self._unsaved.pop(record.id, None)
        self.unfinished.pop(record.id, None)
        self._inserted_s.pop(record.id, None)
        self._written_s.pop(record.id, None)
        return removed

    # ------------------------------------------------------------------ retention

    def flush_unsaved(self) -> None:
        """Write the changes a full disk held back, oldest first; stop at the first refusal."""
        for record in list(self._unsaved.values()):
            try:
                self.store.save(record)
            except StorageFull:
                return
            del self._unsaved[record.id]
            log.info("job %s: its record is written again", record.id)

    def recover(self) -> None:
        """Startup: live records of a previous run become failed (server_restart)."""
        for record in self.store.with_status(LIVE_STATUSES):
            self._delete_files(self._partial_files(record))
            self.move(record, JobStatus.FAILED, error=JobError(
                "server restarted before the job finished", "server_restart"))
        self.prune()

    def prune(self) -> dict[str, Any]:
        """Remove expired records (and, past max_job_records, the oldest terminal ones)."""
        removed_ids: list[str] = []
        files = 0
        for record in self.store.expired(now_s()):
            files += self.remove(record)
            removed_ids.append(record.id)
            self._remember_gone(record.id, f"expired at {record.expires_at} (output_ttl_s="
                                f"{self.ttl_s:g}); its outputs are deleted")
        # counted after the expired ones are gone
        over = self.store.oldest_terminal_over(self.max_records) if self.max_records > 0 else []
        for record in over:
            files += self.remove(record)
            removed_ids.append(record.id)
        return {"object": "outputs.prune", "removed_records": len(removed_ids),
                "removed_files": files, "ids": removed_ids}

    def start_sweeper(self) -> None:
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    def stop_sweeper(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()

    async def _sweep_forever(self) -> None:
        # Sweep at least as often as the TTL, so an expired output never lingers a full minute.
        interval = min(SWEEP_INTERVAL_S, max(1.0, self.ttl_s)) if self.ttl_s else SWEEP_INTERVAL_S
        while True:
            await asyncio.sleep(interval)
            try:
                self.flush_unsaved()
                report = self.prune()
            except Exception:  # the sweeper keeps running; the next pass retries
                log.exception("output sweep failed")
                continue
            if report["removed_records"]:
                log.info("swept %d expired record(s)", report["removed_records"])


def _expired(record: JobRecord) -> bool:
    return record.expires_at is not None and record.expires_at <= now_s()
