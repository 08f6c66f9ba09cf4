"""The Cosmos3 NIM cookbook's generator clients (t2i.py, t2v.py, i2v.py, v2v.py, action.py,
transfer.py), written from the documented request shapes, against a real server on the Cosmos3
dev directory through `NIM_URL=<server>/nim/generator`. The clients' `COSMOS3_OVERRIDES` keep the
runs short (num_frames 25, 2 steps, the 256 action tier); the dev checkpoint serves resolution
keys at a sixteenth of the table (said in X-Worldserve-Resolution). `/v1/infer` must be a thin
translation: its video equals the native `/v1/videos` job's with the same parameters."""

from __future__ import annotations

import base64
import io
import json
import math
import socket
import time

import httpx
import numpy as np
import pytest
import requests
from PIL import Image

from tests.integration.nim.conftest import MAX_UPLOAD_BYTES, data_url, jpeg, mp4
from tests.support.server import ServerProcess
from worldserve.media.video import decode_frames

OVERRIDES = {"num_frames": 25, "num_inference_steps": 2, "seed": 0}
IMAGE = base64.b64encode(jpeg(96, 64)).decode()  # raw base64, the NIM's default form
VIDEO = data_url(mp4(num_frames=25), "video/mp4")
DOMAIN_IDS = {"av": 1, "umi": 6, "bridge_orig_lerobot": 7, "droid_lerobot": 8}
AV = {"domain_name": "av", "action_chunk_size": 8, "raw_action_dim": 9,
      "action_space": "joint_pos", "image_size": "256", "action_fps": 10.0}
ACTION = {"prompt": "You are an autonomous vehicle planning system.", "fps": 10.0,
          "num_inference_steps": 2, "guidance_scale": 1.0, "flow_shift": 10.0, "seed": 0}
CASES = {
    "t2i": {"model_mode": "text2image", "prompt": "{\"subject\":\"robot\"}", "negative_prompt": "",
            "resolution": "720_1_1", "num_frames": 1, "fps": 24.0, "num_inference_steps": 2,
            "guidance_scale": 4.0, "flow_shift": 3.0, "seed": 0},
    "t2v": {"model_mode": "text2video", "prompt": "{\"scene\":\"kitchen\"}", "negative_prompt": "",
            "resolution": "720_16_9", "fps": 24.0, "guidance_scale": 6.0, "flow_shift": 10.0,
            **OVERRIDES},
    "i2v": {"model_mode": "image2video", "prompt": "A car travels along a coastal road.",
            "input_reference": IMAGE, "resolution": "720", "fps": 24.0, **OVERRIDES},
    "v2v": {"model_mode": "video2video", "prompt": "A red sports car.", "input_reference": VIDEO,
            "condition_frame_indexes_vision": [0, 1], "condition_video_keep": "first",
            "resolution": "720", "fps": 24.0, "guidance_scale": 6.0, "flow_shift": 10.0,
            **OVERRIDES},
    "forward_dynamics": {"model_mode": "forward_dynamics", "input_reference": IMAGE,
                         "action_params": {**AV, "action": [[0.01] * 9] * 8}, **ACTION},
    "policy": {"model_mode": "policy", "input_reference": IMAGE, "action_params": AV, **ACTION},
    "inverse_dynamics": {"model_mode": "inverse_dynamics", "input_reference": VIDEO,
                         "action_params": AV, **ACTION},
}


@pytest.fixture(scope="module")
def nim_url(nim_server: ServerProcess) -> str:
    return nim_server.base_url + "/nim/generator"


def infer(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/v1/infer", json=body, timeout=300)


def test_require_generator_profile(nim_url: str) -> None:
    meta = httpx.get(f"{nim_url}/v1/metadata").json()
    assert (meta["model_type"], meta["inference_endpoint"]) == ("generator", "/v1/infer")
    assert meta["selectedModelProfileId"] and meta["model_variant"] in ("nano", "super")
    assert httpx.get(f"{nim_url}/v1/health/ready").json()["status"] == "ready"
    models = httpx.get(f"{nim_url}/v1/models").json()["data"]
    assert "actions" in models[0]["capabilities"] and "infer" in models[0]["capabilities"]


def validate_action(action: object, request: dict) -> None:
    """action.py's checks of a predicted trajectory."""
    params = request["action_params"]
    shape = [params["action_chunk_size"], params["raw_action_dim"]]
    assert isinstance(action, dict) and action["shape"] == shape
    assert len(action["data"]) == shape[0] and all(len(row) == shape[1] for row in action["data"])
    assert all(math.isfinite(v) for row in action["data"] for v in row)
    assert (action["dtype"], action["raw_action_dim"], action["action_mode"],
            action["domain_id"]) == ("float32", shape[1], request["model_mode"],
                                     DOMAIN_IDS[params["domain_name"]])


@pytest.mark.parametrize("case", list(CASES))
def test_cookbook_request_shapes(nim_url: str, case: str) -> None:
    request = CASES[case]
    response = infer(nim_url, request)
    assert response.status_code == 200, response.text
    body = response.json()
    if case == "t2i":
        assert set(body) == {"b64_image"}
        image = Image.open(io.BytesIO(base64.b64decode(body["b64_image"], validate=True)))
        assert image.format == "JPEG" and image.size == (64, 64)  # 720_1_1 / 16
        assert "960x960" in response.headers["x-worldserve-resolution"]
        return
    assert set(body) == {"b64_video", "action"}
    frames = decode_frames(base64.b64decode(body["b64_video"], validate=True))
    if request["model_mode"] in ("policy", "inverse_dynamics"):
        validate_action(body["action"], request)
        assert len(frames) == AV["action_chunk_size"] + 1
    else:
        assert body["action"] is None
        expected = 9 if case == "forward_dynamics" else 25
        assert len(frames) == expected


def test_infer_is_the_native_video_job(nim_server: ServerProcess, nim_url: str) -> None:
    """The same parameters through /v1/infer, /v1/videos and /v1/videos/sync (multipart, as
    vLLM-Omni's Cosmos3 example sends it) give the same frames."""
    nim = infer(nim_url, CASES["t2v"]).json()
    native = {"prompt": CASES["t2v"]["prompt"], "negative_prompt": "", "size": "80x48",
              "num_frames": 25, "fps": 24, "num_inference_steps": 2, "guidance_scale": 6.0,
              "flow_shift": 10.0, "seed": 0}
    with httpx.Client(base_url=nim_server.base_url, timeout=300) as http:
        job = http.post("/v1/videos", json=native).json()
        while job["status"] not in ("completed", "failed"):
            time.sleep(0.1)
            job = http.get(f"/v1/videos/{job['id']}").json()
        assert job["status"] == "completed", job
        video = http.get(f"/v1/videos/{job['id']}/content").content
    expected = np.stack(decode_frames(base64.b64decode(nim["b64_video"])))
    assert np.array_equal(np.stack(decode_frames(video)), expected)
    form = {k: (None, str(v)) for k, v in native.items()}
    form["extra_params"] = (None, '{"use_resolution_template": true, "guardrails": false}')
    synced = httpx.post(f"{nim_server.base_url}/v1/videos/sync", files=form,
                        headers={"Accept": "video/mp4"}, timeout=300)
    assert synced.status_code == 200 and synced.headers["content-type"] == "video/mp4"
    assert float(synced.headers["x-peak-memory-mb"]) > 0
    assert np.array_equal(np.stack(decode_frames(synced.content)), expected)


def test_sync_with_an_uploaded_first_frame(nim_server: ServerProcess) -> None:
    """vLLM-Omni's Cosmos3 first-frame example (with `requests`): multipart fields plus an
    `input_reference` file, `extra_params` a JSON string, `Accept: video/mp4`."""
    fields = {"model": "worldserve-dev-cosmos3", "prompt": "a car", "size": "80x48",
              "num_frames": "25", "fps": "24", "num_inference_steps": "2",
              "guidance_scale": "6.0", "flow_shift": "10.0", "seed": "0",
              "extra_params": '{"condition_video_keep": "first"}'}
    response = requests.post(f"{nim_server.base_url}/v1/videos/sync", data=fields,
                             files={"input_reference": ("f.jpg", jpeg(), "image/jpeg")},
                             headers={"Accept": "video/mp4"}, timeout=300)
    assert response.status_code == 200, response.text
    assert response.content[4:8] == b"ftyp" and len(decode_frames(response.content)) == 25
    job = httpx.get(f"{nim_server.base_url}/v1/videos/{response.headers['x-video-id']}").json()
    assert job["model"] == "worldserve-dev-cosmos3" and job["status"] == "completed"


def test_urlencoded_jobs_like_the_vllm_omni_benchmark(nim_server: ServerProcess) -> None:
    """diffusion_benchmark_serving.py --endpoint /v1/videos --task t2v: form fields without a
    file (URL-encoded), poll, content, delete; reads peak_memory_mb (> 0) and stage_durations."""
    with httpx.Client(base_url=nim_server.base_url, timeout=120) as http:
        created = http.post("/v1/videos", data={"prompt": "a robot", "height": "32",
                                                "width": "48", "num_frames": "9",
                                                "num_inference_steps": "2", "seed": "0",
                                                "fps": "8"})
        assert created.status_code == 200, created.text
        job = created.json()
        assert job["model"] == "worldserve-dev-cosmos3" and job["peak_memory_mb"] == 0.0
        while job["status"] not in ("completed", "failed"):
            time.sleep(0.05)
            job = http.get(f"/v1/videos/{job['id']}").json()
        assert job["status"] == "completed" and job["peak_memory_mb"] > 0
        assert set(job["stage_durations"]) == {"encode", "denoise", "decode", "mux"}
        assert sum(job["stage_durations"].values()) <= job["inference_time_s"] + 1e-3
        assert http.get(f"/v1/videos/{job['id']}/content").content[4:8] == b"ftyp"
        assert http.delete(f"/v1/videos/{job['id']}").json()["deleted"] is True


def _disconnect_while_running(http: httpx.Client, nim_server: ServerProcess, nim_url: str,
                              prompt: str, extra_header: str = "") -> None:
    """Send a slow /v1/infer, wait until its job runs, then close the connection."""
    slow = {**CASES["t2v"], "num_frames": 197, "num_inference_steps": 100, "prompt": prompt}
    body = json.dumps(slow).encode()
    path = nim_url.removeprefix(nim_server.base_url) + "/v1/infer"
    with socket.create_connection(("127.0.0.1", nim_server.port)) as raw:
        raw.sendall(f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json"
                    f"{extra_header}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        wait_for_job(http, prompt, ("in_progress",))


def test_a_disconnecting_client_cancels_its_job(nim_server: ServerProcess, nim_url: str) -> None:
    with httpx.Client(base_url=nim_server.base_url, timeout=30) as http:
        _disconnect_while_running(http, nim_server, nim_url, "a slow clip")
        job = wait_for_job(http, "a slow clip", ("cancelled", "completed", "failed"))
    assert job["status"] == "cancelled", job
    assert job["error"]["message"] == "the client disconnected"


def test_a_job_under_an_idempotency_key_outlives_the_connection(
        nim_server: ServerProcess, nim_url: str) -> None:
    """The retry under the key is meant to find it: a disconnect does not cancel it."""
    header = "\r\nIdempotency-Key: slow-retry"
    with httpx.Client(base_url=nim_server.base_url, timeout=30) as http:
        _disconnect_while_running(http, nim_server, nim_url, "a kept clip", header)
        time.sleep(1.0)  # the disconnect is seen well within this
        job = wait_for_job(http, "a kept clip", ("in_progress",))
        assert http.delete(f"/v1/videos/{job['id']}").status_code == 200


def wait_for_job(http: httpx.Client, prompt: str, states: tuple[str, ...]) -> dict:
    for _ in range(600):
        jobs = [j for j in http.get("/v1/videos").json()["data"] if j["revised_prompt"] == prompt]
        if jobs and jobs[0]["status"] in states:
            return jobs[0]
        time.sleep(0.02)
    raise AssertionError(f"no job with prompt {prompt!r} reached {states}")


@pytest.mark.parametrize("change, status, words", [
    ({"num_inference_steps": "2"}, 422, "valid integer"),
    ({"num_inference_steps": 2.0}, 422, "valid integer"),
    ({"num_inference_steps": True}, 422, "valid integer"),
    ({"bogus": 1}, 422, "unknown field"),
    ({"steps": 2}, 422, "retired"),
    ({"extra_params": "{}"}, 422, "vLLM-Omni"),
    ({"resolution": "1080"}, 422, "resolution table"),
    ({"num_frames": 24}, 422, "1 + 4k"),
    ({"model_mode": "video2video", "transfer": {"edge": {"video": VIDEO}},
      "input_reference": VIDEO}, 422, "no control inputs"),
    ({"model_mode": "image2video", "input_reference": "not base64!"}, 422, "raw base64"),
    ({"model_mode": "image2video", "input_reference": "http://127.0.0.1:9/x.jpg"}, 422,
     "non-public address"),
    ({"model_mode": "image2video",
      "input_reference": base64.b64encode(b"\xff\xd8\xff" + b"\0" * MAX_UPLOAD_BYTES).decode()},
     413, "limit"),
])
def test_hostile_infer(nim_url: str, change: dict, status: int, words: str) -> None:
    response = infer(nim_url, {**CASES["t2v"], **change})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    assert words in error["message"]


def test_the_reasoner_mount_refuses_infer(nim_server: ServerProcess) -> None:
    response = infer(nim_server.base_url + "/nim/reasoner", CASES["t2i"])
    assert response.status_code == 404
    assert "requires a generator deployment" in response.json()["error"]["message"]


def test_unknown_models_get_one_answer(nim_server: ServerProcess) -> None:
    expected = ("The model 'nope' does not exist; this server serves "
                "'worldserve-dev-cosmos3'")
    with httpx.Client(base_url=nim_server.base_url, timeout=60) as http:
        for response in (
            http.post("/v1/videos", json={"prompt": "x", "model": "nope"}),
            http.post("/v1/images/generations", json={"prompt": "x", "model": "nope"}),
            http.post("/v1/chat/completions", json={
                "model": "nope", "messages": [{"role": "user", "content": "x"}]}),
            http.get("/v1/models/nope"),
        ):
            assert response.status_code == 404, response.text
            assert response.json()["error"]["message"] == expected
        models = http.get("/v1/models").json()["data"]
        assert [m["id"] for m in models] == ["worldserve-dev-cosmos3"]  # one entry, two stages
        assert set(models[0]["stages"]) == {"generation", "reasoner"}


@pytest.mark.parametrize("case", ["t2i", "t2v"])
def test_infer_idempotency_key(nim_server: ServerProcess, nim_url: str, case: str) -> None:
    """The same key and body answer the job the first request made (one video listed, the
    same bytes); the key with another body is a 409 naming it."""
    headers = {"Idempotency-Key": f"nim-{case}"}
    listed = len(httpx.get(f"{nim_server.base_url}/v1/videos", timeout=10).json()["data"])
    first, again = (httpx.post(f"{nim_url}/v1/infer", json=CASES[case], headers=headers,
                               timeout=300) for _ in range(2))
    assert first.status_code == again.status_code == 200, first.text
    assert first.json() == again.json()
    assert float(first.headers["x-inference-time-s"]) > 0
    assert "total;dur=" in first.headers["server-timing"]
    now = len(httpx.get(f"{nim_server.base_url}/v1/videos", timeout=10).json()["data"])
    assert now == listed + (case == "t2v")
    other = httpx.post(f"{nim_url}/v1/infer", json={**CASES[case], "seed": 7}, headers=headers,
                       timeout=300)
    assert other.status_code == 409 and f"'nim-{case}'" in other.text, other.text
