"""Truthful job status through a real server (the Wan dev model, one request running at a time):
a job is `queued` with a falling `queue_position` until the engine admits it, `in_progress`
with monotone progress, phases and steps after; the list and `/metrics` agree; `DELETE` on a
running job takes its row out of the engine's batch at the next step boundary (the time it takes
is printed: `pytest -s`); the `queue` phase of `Server-Timing`."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.generation.test_lifecycle import wait_status

LONG = {"prompt": "long", "size": "64x64", "num_frames": 9, "num_inference_steps": 400}
SHORT_B = {"prompt": "b", "size": "64x64", "num_frames": 5, "num_inference_steps": 3}
SHORT_C = {"prompt": "c", "size": "64x64", "num_frames": 1, "num_inference_steps": 3}
ORDER = {"queued": 0, "in_progress": 1, "completed": 2, "failed": 2, "cancelled": 2}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tests.support.server import ServerProcess

    server = ServerProcess(tmp_path_factory.mktemp("progress"), {"stages": {
        "reasoner": {"enabled": False},
        "generation": {"max_running_requests": 1, "batch_wait_ms": 0}}})
    server.wait_healthy()
    yield server
    server.stop()


def metrics(base: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"{base}/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def jobs_metric(figures: dict, status: str) -> float:
    return figures[("worldserve_jobs", (("kind", "video"), ("status", status)))]


class ListPoller(threading.Thread):
    """Snapshots of `GET /v1/videos` every few milliseconds, until stopped."""

    def __init__(self, base: str) -> None:
        super().__init__(daemon=True)
        self.base, self.snapshots, self.stopped = base, [], threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.base, timeout=10) as http:
            while not self.stopped.is_set():
                data = http.get("/v1/videos", params={"limit": 100}).json()["data"]
                self.snapshots.append({job["id"]: job for job in data})
                time.sleep(0.005)

    def history(self, job_id: str) -> list[dict]:
        return [snap[job_id] for snap in self.snapshots if job_id in snap]


def assert_truthful(poller: ListPoller, ids: list[str]) -> None:
    for snapshot in poller.snapshots:  # one request may run at a time: one job in progress
        assert sum(job["status"] == "in_progress" for job in snapshot.values()) <= 1, snapshot
    for job_id in ids:
        history = poller.history(job_id)
        statuses = [ORDER[job["status"]] for job in history]
        assert statuses == sorted(statuses), [job["status"] for job in history]
        progress = [job["progress"] for job in history]
        assert progress == sorted(progress)
        positions = [job["queue_position"] for job in history if job["status"] == "queued"]
        assert positions == sorted(positions, reverse=True) and None not in positions
        running = [job for job in history if job["status"] == "in_progress"]
        assert all(job["queue_position"] is None and job["phase"] in
                   ("encode", "denoise", "decode", "mux") for job in running)
        steps = [job["step"] for job in running]
        assert steps == sorted(steps)


def test_queued_until_admitted_and_delete_stops_the_running_row(server):
    base = server.base_url
    poller = ListPoller(base)
    poller.start()
    with httpx.Client(base_url=base, timeout=60) as http:
        a = http.post("/v1/videos", json=LONG).json()
        a = wait_status(base, a["id"], {"in_progress"})
        b, c = (http.post("/v1/videos", json=body).json() for body in (SHORT_B, SHORT_C))
        assert (b["status"], c["status"]) == ("queued", "queued")
        assert (b["queue_position"], c["queue_position"]) == (0, 1)

        # while b and c wait behind a: the list and /metrics say so
        listed = {job["id"]: job for job in http.get("/v1/videos").json()["data"]}
        figures = metrics(base)
        assert [listed[j["id"]]["status"] for j in (a, b, c)] == [
            "in_progress", "queued", "queued"]
        assert jobs_metric(figures, "queued") == 2 and jobs_metric(figures, "in_progress") == 1
        assert figures[("worldserve_job_queue_oldest_wait_seconds", (("kind", "video"),))] > 0

        running = wait_until(http, a["id"], lambda job: job["step"] >= 2)
        assert running["phase"] == "denoise" and running["total_steps"] == 400
        deleted_s = delete(http, a["id"])
        for job in (b, c):
            done = wait_status(base, job["id"], {"completed"}, timeout_s=120)
            assert done["queue_wait_s"] > 0 and done["progress"] == 100
            timing = http.get(f"/v1/videos/{job['id']}/content").headers["server-timing"]
            assert timing.startswith("queue;dur=")
        figures = metrics(base)
        assert figures[("worldserve_job_queue_wait_seconds_count", (("kind", "video"),))] >= 3
        assert jobs_metric(figures, "queued") == 0

        # alone: after DELETE the engine holds no row at all
        d = http.post("/v1/videos", json=LONG).json()
        wait_until(http, d["id"], lambda job: job["step"] >= 2)
        alone_s = delete(http, d["id"])
        figures = metrics(base)
        assert figures[("worldserve_stage_running", (("stage", "generation"),))] == 0
        assert jobs_metric(figures, "in_progress") == 0
    poller.stopped.set()
    poller.join()
    assert_truthful(poller, [a["id"], b["id"], c["id"], d["id"]])
    print(f"\nDELETE -> row out of the batch: {deleted_s * 1000:.0f} ms with jobs queued, "
          f"{alone_s * 1000:.0f} ms alone")


def wait_until(http: httpx.Client, job_id: str, ready) -> dict:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        job = http.get(f"/v1/videos/{job_id}").json()
        if ready(job):
            return job
        time.sleep(0.01)
    raise AssertionError(f"job {job_id} never got there: {job}")


def delete(http: httpx.Client, job_id: str) -> float:
    """Seconds from DELETE to its answer, which comes once the stage confirmed the row left
    its batch (MediaService.delete_video waits for it)."""
    started = time.perf_counter()
    response = http.delete(f"/v1/videos/{job_id}")
    elapsed = time.perf_counter() - started
    assert response.status_code == 200 and response.json()["deleted"] is True
    assert http.get(f"/v1/videos/{job_id}").status_code == 404
    return elapsed
