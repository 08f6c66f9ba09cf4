"""A full output disk (a 2 MiB tmpfs the test mounts: it needs root's mount rights, as
tests/support/machine.py requires; tests/unit/generation/test_outputs_full.py injects ENOSPC
at the same boundaries without them): new jobs
answer 507 with a clear message, a running job fails `storage_full`, nothing half-written
stays, /health stays 200, and once there is room the server works again."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.integration.generation.conftest import start_server
from tests.integration.generation.test_lifecycle import LONG_VIDEO, wait_status
from tests.support.machine import missing

IMAGE = {"prompt": "x", "size": "64x64", "num_inference_steps": 2}
VIDEO = {**LONG_VIDEO, "num_inference_steps": 150}  # still running when the disk fills


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "outputs"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs",
                              str(mount_point)], capture_output=True, text=True)
    if mounted.returncode != 0:
        missing(f"cannot mount a small tmpfs here (needs root and mount rights): "
                f"{mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _fill(disk: Path) -> Path:
    filler = disk / "filler"
    with open(filler, "wb") as out:
        try:
            while True:
                out.write(b"\0" * 65536)
                out.flush()
        except OSError:  # ENOSPC: the disk is full
            pass
    return filler


def test_full_disk_fails_jobs_clearly_and_the_server_recovers(small_disk: Path,
                                                              gen_model_dir: Path) -> None:
    server = start_server(small_disk.parent, gen_model_dir)
    try:
        base = server.base_url
        job = httpx.post(f"{base}/v1/videos", json=VIDEO, timeout=30).json()
        wait_status(base, job["id"], {"in_progress"})
        filler = _fill(small_disk)

        refused = httpx.post(f"{base}/v1/images/generations", json=IMAGE, timeout=60)
        assert refused.status_code == 507
        assert "disk is full" in refused.json()["error"]["message"]
        assert httpx.get(f"{base}/health").json()["status"] == "ok"

        failed = wait_status(base, job["id"], {"failed", "completed"}, timeout_s=300)
        assert failed["status"] == "failed" and failed["error"]["code"] == "storage_full", failed
        assert "disk is full" in failed["error"]["message"]
        assert str(small_disk) not in failed["error"]["message"]
        assert not [p.name for p in small_disk.iterdir() if p.name.startswith(job["id"])
                    or p.name.startswith(f".{job['id']}")]

        filler.unlink()
        image = httpx.post(f"{base}/v1/images/generations", json=IMAGE, timeout=60)
        assert image.status_code == 200, image.text
        assert httpx.get(image.json()["data"][0]["url"]).status_code == 200
        assert httpx.get(f"{base}/v1/videos/{job['id']}").json()["status"] == "failed"
    finally:
        server.stop()
