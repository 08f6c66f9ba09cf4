"""Image and video records in `<output_dir>/.worldserve/records.sqlite3` (stdlib sqlite3).

One row per record: indexed columns for queries (kind, status, created_at, expires_at) and the
record itself as JSON. Every state change is one committed transaction, so a crash never
leaves a half-written record. Removed records leave a tombstone (why they went) in a bounded
table, so a late GET still says `expired`, across restarts too, and the api's memory does not
grow with every record it ever removed; SQLite's page cache is bounded (`PAGE_CACHE_KIB`).
Used from the api's event loop only (one connection; the statements are tiny, so running them
inline is cheaper than a thread hop).
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any, Iterable, Iterator

from worldserve.api.jobs.records import TERMINAL_STATUSES, JobRecord, JobStatus
from worldserve.errors import StorageFull

PAGE_CACHE_KIB = 1024  # SQLite's page cache for this connection (its default is 2,000 KiB)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    expires_at INTEGER,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS records_kind_created ON records (kind, created_at, seq);
CREATE INDEX IF NOT EXISTS records_expires ON records (expires_at);
CREATE TABLE IF NOT EXISTS idempotency_keys (
    key TEXT PRIMARY KEY,
    record_id TEXT NOT NULL,
    fingerprint TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS gone (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    why TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS idempotency_keys_record ON idempotency_keys (record_id);
CREATE TABLE IF NOT EXISTS answers (
    id TEXT PRIMARY KEY,
    media_type TEXT NOT NULL,
    body BLOB NOT NULL,
    expires_at INTEGER NOT NULL
);
"""


@contextlib.contextmanager
def _disk_full_is_storage_full() -> Iterator[None]:
    """SQLite's SQLITE_FULL (`database or disk is full`) as StorageFull; the failed statement
    changed nothing (it is its own transaction)."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        if getattr(exc, "sqlite_errorcode", None) != sqlite3.SQLITE_FULL:
            raise
        raise StorageFull("the output directory's disk is full: the job record cannot be "
                          "written; free space there or lower --output-ttl") from None


class RecordStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(f"PRAGMA cache_size=-{PAGE_CACHE_KIB}")
        self._db.executescript(_SCHEMA)
        row = self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM records").fetchone()
        self._seq = int(row[0])

    def close(self) -> None:
        self._db.close()

    # ------------------------------------------------------------------ writes

    def _write(self, sql: str, args: tuple[Any, ...]) -> sqlite3.Cursor:
        with _disk_full_is_storage_full():
            return self._db.execute(sql, args)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """The writes inside commit together (one commit, one WAL frame set) or not at all."""
        self._db.execute("BEGIN")
        try:
            yield
            with _disk_full_is_storage_full():
                self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    def insert(self, record: JobRecord) -> None:
        record.seq = self._seq + 1
        self._write(
            "INSERT INTO records (id, kind, status, created_at, seq, expires_at, data) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                record.id,
                record.kind,
                record.status.value,
                record.created_at,
                record.seq,
                record.expires_at,
                record.to_json().decode(),
            ),
        )
        self._seq = record.seq

    def save(self, record: JobRecord) -> None:
        """Write the whole record back (one atomic statement)."""
        self._write(
            "UPDATE records SET status = ?, expires_at = ?, data = ? WHERE id = ?",
            (record.status.value, record.expires_at, record.to_json().decode(), record.id),
        )

    def delete(self, record_id: str) -> bool:
        """Remove a record and the Idempotency-Keys that named it (keys expire with their
        job)."""
        self._write("DELETE FROM idempotency_keys WHERE record_id = ?", (record_id,))
        return self._write("DELETE FROM records WHERE id = ?", (record_id,)).rowcount > 0

    def remember_key(self, key: str, fingerprint: str, record_id: str) -> None:
        self._write("INSERT INTO idempotency_keys (key, record_id, fingerprint) VALUES (?, ?, ?)",
                    (key, record_id, fingerprint))

    def key_record(self, key: str) -> tuple[str, str] | None:
        """(record id, request fingerprint) an Idempotency-Key names, None when unknown."""
        row = self._db.execute("SELECT record_id, fingerprint FROM idempotency_keys WHERE key = ?",
                               (key,)).fetchone()
        return (row[0], row[1]) if row is not None else None

    def save_answer(self, answer_id: str, media_type: str, body: bytes,
                    expires_at: int) -> None:
        """A synchronous answer that is no job record (an action generation), kept for the
        Idempotency-Key that names it until `expires_at`."""
        self._write("INSERT INTO answers (id, media_type, body, expires_at) VALUES (?, ?, ?, ?)",
                    (answer_id, media_type, body, expires_at))

    def answer(self, answer_id: str) -> tuple[bytes, str] | None:
        """(body, media type) of a kept answer, None when unknown or dropped."""
        row = self._db.execute("SELECT body, media_type FROM answers WHERE id = ?",
                               (answer_id,)).fetchone()
        return (bytes(row[0]), row[1]) if row is not None else None

    def drop_expired_answers(self, now: int) -> None:
        """Answers past their time go, with the keys that named them."""
        self._write("DELETE FROM idempotency_keys WHERE record_id IN "
                    "(SELECT id FROM answers WHERE expires_at <= ?)", (now,))
        self._write("DELETE FROM answers WHERE expires_at <= ?", (now,))

    def remember_gone(self, record_id: str, why: str, keep: int) -> None:
        """A tombstone for a removed record; only the newest `keep` are kept (one transaction)."""
        with self._transaction():
            cursor = self._write("INSERT OR REPLACE INTO gone (id, why) VALUES (?, ?)",
                                 (record_id, why))
            self._write("DELETE FROM gone WHERE seq <= ?", (cursor.lastrowid - keep,))

    def why_gone(self, record_id: str) -> str | None:
        """Why a removed record went, while its tombstone is kept."""
        row = self._db.execute("SELECT why FROM gone WHERE id = ?", (record_id,)).fetchone()
        return row[0] if row is not None else None

    # ------------------------------------------------------------------ reads

    def get(self, record_id: str, kind: str | None = None) -> JobRecord | None:
        row = self._db.execute(
            "SELECT kind, data FROM records WHERE id = ?", (record_id,)
        ).fetchone()
        if row is None or (kind is not None and row[0] != kind):
            return None
        return JobRecord.from_json(row[1])

    def page(
        self, kind: str, after: str | None, limit: int, descending: bool, now: int
    ) -> tuple[list[JobRecord], bool]:
        """Records of `kind` ordered by (created_at, seq), starting after record `after`."""
        anchor = None
        if after is not None:
            anchor = self.position(after, kind)
            if anchor is None:
                return [], False
        return self.page_after(kind, anchor, limit, descending, now)

    def position(self, record_id: str, kind: str) -> tuple[int, int] | None:
        """The record's place in the listing order: (created_at, seq)."""
        row = self._db.execute(
            "SELECT created_at, seq FROM records WHERE id = ? AND kind = ?", (record_id, kind)
        ).fetchone()
        return (int(row[0]), int(row[1])) if row is not None else None

    def page_after(
        self, kind: str, anchor: tuple[int, int] | None, limit: int, descending: bool, now: int
    ) -> tuple[list[JobRecord], bool]:
        """Records of `kind` whose (created_at, seq) comes after `anchor` in the order (several
        api replicas merge their pages by position: cluster/listing.py)."""
        op, direction = ("<", "DESC") if descending else (">", "ASC")
        where, args = "kind = ? AND (expires_at IS NULL OR expires_at > ?)", [kind, now]
        if anchor is not None:
            where += f" AND (created_at, seq) {op} (?, ?)"
            args += list(anchor)
        rows = self._db.execute(
            f"SELECT data FROM records WHERE {where} ORDER BY created_at {direction}, seq {direction} "  # noqa: E501
            "LIMIT ?",
            (*args, limit + 1),
        ).fetchall()
        items = [JobRecord.from_json(r[0]) for r in rows]
        return items[:limit], len(items) > limit

    def with_status(self, statuses: Iterable[JobStatus]) -> list[JobRecord]:
        values = [status.value for status in statuses]
        marks = ",".join("?" * len(values))
        rows = self._db.execute(f"SELECT data FROM records WHERE status IN ({marks})", values)
        return [JobRecord.from_json(r[0]) for r in rows.fetchall()]

    def expired(self, now: int) -> list[JobRecord]:
        rows = self._db.execute(
            "SELECT data FROM records WHERE expires_at IS NOT NULL AND expires_at <= ? "
            "ORDER BY seq", (now,)
        ).fetchall()
        return [JobRecord.from_json(r[0]) for r in rows]

    def oldest_terminal_over(self, max_records: int) -> list[JobRecord]:
        """Terminal records to drop so that at most `max_records` records remain."""
        total = self._db.execute("SELECT COUNT(*) FROM records").fetchone()[0]
        excess = total - max_records
        if excess <= 0:
            return []
        marks = ",".join("?" * len(TERMINAL_STATUSES))
        rows = self._db.execute(
            f"SELECT data FROM records WHERE status IN ({marks}) ORDER BY created_at, seq LIMIT ?",
            (*(status.value for status in TERMINAL_STATUSES), excess),
        ).fetchall()
        return [JobRecord.from_json(r[0]) for r in rows]
