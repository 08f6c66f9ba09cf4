"""Crash-consistent job records: a process SIGKILLed while it writes records (at random
moments, several times over the same SQLite file) leaves every record it reported readable, and
the next run finishes the live ones as `failed` with a reason (api/jobs/ledger.py recover)."""

from __future__ import annotations

import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from tests.support.server import REPO_ROOT, base_env
from worldserve.api.jobs.ledger import RECORDS_FILE, JobLedger
from worldserve.api.jobs.records import JobError, JobRecord, JobStatus

ROUNDS = 5


def _write_then_kill(output_dir: Path, rng: random.Random) -> list[str]:
    """Run the writer, SIGKILL it mid-stream; the ids it reported as committed."""
    writer = subprocess.Popen([sys.executable, "-m", "tests.support.record_writer",
                               str(output_dir)], cwd=REPO_ROOT, env=base_env(),
                              stdout=subprocess.PIPE, text=True)
    reported: list[str] = []
    assert writer.stdout is not None
    reported.append(writer.stdout.readline().strip())  # it is writing now
    time.sleep(rng.uniform(0.05, 0.6))
    writer.send_signal(signal.SIGKILL)
    out, _ = writer.communicate(timeout=10)
    assert writer.returncode == -signal.SIGKILL
    return reported + out.split()


def _rows(output_dir: Path) -> dict[str, JobRecord]:
    db = sqlite3.connect(str(output_dir / RECORDS_FILE))
    try:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        rows = db.execute("SELECT id, data FROM records").fetchall()
    finally:
        db.close()
    return {row_id: JobRecord.from_json(data) for row_id, data in rows}  # every one parses


def test_sigkill_mid_write_leaves_every_record_readable(tmp_path: Path) -> None:
    rng = random.Random(34)
    output_dir = tmp_path / "outputs"
    reported: list[str] = []
    for _ in range(ROUNDS):
        reported += _write_then_kill(output_dir, rng)
        JobLedger(output_dir, ttl_s=0, max_records=0).recover()  # the next run's start
        records = _rows(output_dir)
        assert set(reported) <= set(records), "a committed record was lost"
        assert not [r for r in records.values() if r.status.is_live], "a live job was left"
    failed = [r for r in records.values() if r.status == JobStatus.FAILED]
    assert failed and all(r.error == JobError("server restarted before the job finished",
                                              "server_restart") for r in failed)
    assert len(records) > ROUNDS
