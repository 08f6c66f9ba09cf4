"""A process that writes job records as fast as it can, for crash tests: SIGKILL it at any
moment and every record it reported must be readable by the next run.

`python -m tests.support.record_writer OUTPUT_DIR`: inserts records (a 64 KiB prompt each, so
that most of its time is spent inside writes), moves them queued -> in_progress -> progress
updates -> completed or left live, and prints each record's id once its insert committed.
"""

from __future__ import annotations

import itertools
import sys
import time
import uuid
from pathlib import Path

from worldserve.api.jobs.ledger import JobLedger
from worldserve.api.jobs.records import JobRecord, JobStatus

PROMPT = "x" * 65536


def main(output_dir: Path) -> None:
    ledger = JobLedger(output_dir, ttl_s=0, max_records=0)
    for n in itertools.count():
        record = JobRecord(id=str(uuid.uuid4()), kind="video", created_at=int(time.time()),
                           size="64x64", revised_prompt=PROMPT)
        ledger.insert(record)
        print(record.id, flush=True)
        ledger.move(record, JobStatus.IN_PROGRESS, progress=1)
        for progress in range(2, 40, 7):
            record.progress = progress
            ledger.store.save(record)
        if n % 3:  # two in three finish; the others stay live for the next run to fail
            ledger.move(record, JobStatus.COMPLETED, file_names=[f"{record.id}.mp4"])


if __name__ == "__main__":
    main(Path(sys.argv[1]))
