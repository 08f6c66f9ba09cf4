"""Job records across restarts, retention, stage death, and warmup readiness (spec §6, §9,
§11 items 9-12). Real servers sharing one output directory and SQLite file."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import threading
import time

import httpx

from tests.integration.generation.conftest import start_server

LONG_VIDEO = {"prompt": "long", "size": "64x64", "num_frames": 9, "num_inference_steps": 1000}


def wait_status(base_url: str, job_id: str, statuses: set[str], timeout_s: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = httpx.get(f"{base_url}/v1/videos/{job_id}", timeout=5).json()
        if job.get("status") in statuses:
            return job
        time.sleep(0.02)
    raise AssertionError(f"job {job_id} never reached {statuses}")


def stored(workdir, job_id: str) -> dict:
    db = sqlite3.connect(str(workdir / "outputs" / ".worldserve" / "records.sqlite3"))
    try:
        row = db.execute("SELECT data FROM records WHERE id = ?", (job_id,)).fetchone()
    finally:
        db.close()
    return json.loads(row[0])


def test_restart_ttl_and_stage_death(tmp_path, gen_model_dir):
    # 1. a job in progress when the whole server is killed
    first = start_server(tmp_path, gen_model_dir)
    job = httpx.post(f"{first.base_url}/v1/videos", json=LONG_VIDEO, timeout=30).json()
    wait_status(first.base_url, job["id"], {"in_progress"})
    first.proc.kill()
    first.proc.wait()
    first.stop()

    # 2. after a restart the job is failed (server_restart); TTL removes outputs and records
    second = start_server(tmp_path, gen_model_dir, args=["--output-ttl", "2"])
    try:
        base = second.base_url
        restarted = httpx.get(f"{base}/v1/videos/{job['id']}").json()
        assert restarted["status"] == "failed"
        assert restarted["error"] == {"message": "server restarted before the job finished",
                                      "code": "server_restart"}
        assert not list((tmp_path / "outputs").glob(f".{job['id']}*"))  # partial outputs gone
        image = httpx.post(f"{base}/v1/images/generations", timeout=30,
                           json={"prompt": "x", "size": "64x64", "num_inference_steps": 2}).json()
        path = tmp_path / "outputs" / f"{image['id']}.png"
        assert path.is_file()
        assert httpx.get(image['data'][0]['url']).status_code == 200
        deadline = time.monotonic() + 10
        while path.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not path.exists()  # the sweeper deleted the expired output
        assert httpx.get(image['data'][0]['url']).status_code == 404
        assert httpx.get(f"{base}/v1/videos/{job['id']}").status_code == 404
        report = httpx.post(f"{base}/admin/outputs/prune").json()
        assert report["object"] == "outputs.prune" and report["removed_records"] == 0

        # 3. SIGKILL the generation stage during an image request and a video job
        video = httpx.post(f"{base}/v1/videos", json=LONG_VIDEO, timeout=30).json()
        wait_status(base, video["id"], {"in_progress"})
        result: dict = {}

        def slow_image() -> None:
            started = time.monotonic()
            resp = httpx.post(f"{base}/v1/images/generations", timeout=60,
                              json={"prompt": "x", "size": "64x64", "num_inference_steps": 1000})
            result.update(status=resp.status_code, body=resp.json(),
                          elapsed=time.monotonic() - started)

        thread = threading.Thread(target=slow_image)
        thread.start()
        time.sleep(0.3)
        killed_at = time.monotonic()
        os.kill(second.stage_pids()["generation"], signal.SIGKILL)
        thread.join(30)
        assert result["status"] == 503
        assert result["body"]["detail"] == "Generation runtime stopped"
        assert time.monotonic() - killed_at < 10  # at once, not at a client deadline
        assert second.proc.wait(30) != 0  # the server exits non-zero when the stage fails
        failed = stored(tmp_path, video["id"])
        assert failed["status"] == "failed" and failed["error"]["code"] == "stage_unavailable"
    finally:
        second.stop()


def test_server_warmup_gates_health(tmp_path, gen_model_dir):
    model = shutil.copytree(gen_model_dir, tmp_path / "slow-warmup")
    marker = model / "worldserve_dev.json"
    data = json.loads(marker.read_text())
    data["sampling_defaults"] = {"num_inference_steps": 100}
    marker.write_text(json.dumps(data))
    # The seed's spelling: warmup_mode/warmup_resolutions inside server_args_overrides
    # (config tests show it equals the stage fields).
    server = start_server(tmp_path, model, wait=False, warmup_steps=100,
                          server_args_overrides={"warmup_mode": "server",
                                                 "warmup_resolutions": ["256x256"]})
    try:
        seen = []

        def warming_or_ok(resp: httpx.Response) -> bool:
            seen.append((resp.status_code, resp.json().get("status")))
            return resp.status_code == 503 and resp.json().get("status") == "warming"

        server.wait_healthy(ok=warming_or_ok)
        started = time.monotonic()
        early = httpx.post(f"{server.base_url}/v1/images/generations", timeout=60,
                           json={"prompt": "x", "size": "64x64", "num_inference_steps": 2})
        assert early.status_code == 200  # queued behind the warmup, not rejected
        assert httpx.get(f"{server.base_url}/health").status_code == 200
        assert time.monotonic() - started < 60
    finally:
        server.stop()


def test_failed_explicit_warmup_fails_startup(tmp_path, gen_model_dir):
    server = start_server(tmp_path, gen_model_dir, wait=False, warmup_resolutions=["72x64"])
    try:
        assert server.proc.wait(60) != 0
        assert "multiple of 16" in server.log()
    finally:
        server.stop()


def test_orderly_shutdown_cancels_live_jobs(tmp_path, gen_model_dir):
    server = start_server(tmp_path, gen_model_dir)
    job = httpx.post(f"{server.base_url}/v1/videos", json=LONG_VIDEO, timeout=30).json()
    wait_status(server.base_url, job["id"], {"in_progress"})
    assert server.stop() == 0
    record = stored(tmp_path, job["id"])
    assert record["status"] == "cancelled"
    assert record["error"]["code"] == "cancelled"
