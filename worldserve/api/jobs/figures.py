"""The job ledger's queue figures for `/metrics`, from the same records the job list shows.

`worldserve_jobs{kind, status}` counts the unfinished jobs (queued: accepted, not yet admitted
by the engine; in_progress: admitted), so a scrape and `GET /v1/videos` agree.
`worldserve_job_queue_wait_seconds` is a histogram observed when the engine admits a job
(acceptance to admission, the `queue` entry of `Server-Timing`); a histogram only moves when a
wait ends, so `worldserve_job_queue_oldest_wait_seconds` says how long the longest wait in
progress has lasted so far (not zero while a job waits).
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from worldserve.api.jobs.ledger import JobLedger
from worldserve.api.jobs.records import LIVE_STATUSES

KINDS = ("image", "video")
QUEUE_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)


def queue_wait_histogram(registry: CollectorRegistry) -> Histogram:
    return Histogram("worldserve_job_queue_wait_seconds",
                     "From a job's acceptance to the engine admitting it into a batch",
                     ["kind"], registry=registry, buckets=QUEUE_BUCKETS_S)


class QueueFigures(Collector):
    """Rendered at scrape time from the ledger's unfinished records."""

    def __init__(self, ledger: JobLedger) -> None:
        self.ledger = ledger

    def collect(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily("worldserve_jobs", "Unfinished jobs by status (queued: not "
                                 "admitted by the engine yet)", labels=["kind", "status"])
        counts = {(kind, status.value): 0 for kind in KINDS for status in LIVE_STATUSES}
        for record in self.ledger.unfinished.values():
            counts[(record.kind, record.status.value)] += 1
        for (kind, status), count in counts.items():
            jobs.add_metric([kind, status], count)
        oldest = GaugeMetricFamily("worldserve_job_queue_oldest_wait_seconds",
                                   "How long the longest-waiting queued job has waited so far "
                                   "(0: none waits)", labels=["kind"])
        waits = self.ledger.queue_waits_s()
        for kind in KINDS:
            oldest.add_metric([kind], max((s for k, s in waits if k == kind), default=0.0))
        yield jobs
        yield oldest
