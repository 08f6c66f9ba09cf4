"""`worldserve serve --model-path <Cosmos3 dir>` (a real server, real stage process): images,
a video job with a sound track, cancellation, forward dynamics and policy actions."""

from __future__ import annotations

import base64
import io
import time

import httpx
import numpy as np
import pytest
from PIL import Image

from worldserve.media.video import decode_audio, decode_frames

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def png_data_url() -> str:
    buf = io.BytesIO()
    Image.new("RGB", (56, 40), (30, 160, 90)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def wait(http: httpx.Client, job_id: str, until=("completed", "failed", "cancelled")) -> dict:
    for _ in range(1200):
        job = http.get(f"/v1/videos/{job_id}").json()
        if job["status"] in until:
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} stuck: {job}")


def test_cosmos3_server_end_to_end(server_factory, cosmos3_dir) -> None:
    server = server_factory(config={"stages": {"reasoner": {"enabled": False},
                                               "realtime": {"enabled": False}}},
                            args=["--model-path", str(cosmos3_dir)])
    with httpx.Client(base_url=server.base_url, timeout=120) as http:
        image = http.post("/v1/images/generations", json={"prompt": "a cup"})
        assert image.status_code == 200, image.text
        assert base64.b64decode(image.json()["data"][0]["b64_json"])[:4] == b"\x89PNG"

        job = http.post("/v1/videos", json={"prompt": "a robot", "size": "48x32",
                                            "num_frames": 9, "generate_sound": True}).json()
        job = wait(http, job["id"])
        assert job["status"] == "completed" and job["progress"] == 100
        data = http.get(job["url"]).content
        assert len(decode_frames(data)) == 9 and decode_audio(data) is not None

        long = http.post("/v1/videos", json={"prompt": "a robot", "size": "48x32",
                                             "num_frames": 9,
                                             "num_inference_steps": 400}).json()
        running = wait(http, long["id"], until=("in_progress",))
        deleted = http.delete(f"/v1/videos/{long['id']}").json()
        assert running["status"] == "in_progress" and deleted["deleted"] is True
        assert http.get(f"/v1/videos/{long['id']}").status_code == 404
        assert not list((server.workdir / "outputs").glob(f"{long['id']}*"))

        rows = np.zeros((4, 9)).tolist()
        fd = http.post("/v1/videos", json={"prompt": "drive", "action_mode": "forward_dynamics",
                                           "domain_name": "av", "action": rows,
                                           "input_reference": png_data_url(),
                                           "resolution_tier": 256}).json()
        fd = wait(http, fd["id"])
        assert fd["status"] == "completed" and fd["action"]["shape"] == [4, 9]

        policy = http.post("/v1/actions/generations", json={
            "input": {"task": "pick", "image": png_data_url()},
            "parameters": {"domain_name": "pusht", "action_horizon": 4,
                           "resolution_tier": 256}})
        assert policy.status_code == 200, policy.text
        assert policy.json()["data"][0]["action"]["shape"] == [4, 2]
        assert http.get("/v1/actions/metadata").json()["policy_family"] == "cosmos3"
