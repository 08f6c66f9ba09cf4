"""Output lifetimes and size limits through a real server (the Wan dev model, `--output-ttl 2`).

A client polls a finished job across its TTL: every answer is `completed` with content that
downloads, or a 404 whose code is `expired`, never `completed` with a missing file. A request
past the model's declared limits is a 400 naming the field and the limits on every route that
starts generation, and exactly at the limits it runs."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.integration.generation.test_lifecycle import wait_status
from tests.support.server import ServerProcess

VIDEO = {"prompt": "x", "size": "64x64", "num_frames": 5, "num_inference_steps": 2}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = ServerProcess(tmp_path_factory.mktemp("ttl"), {"stages": {
        "reasoner": {"enabled": False}}}, args=["--output-ttl", "2"])
    server.wait_healthy()
    yield server
    server.stop()


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        yield client


def says_expired(response: httpx.Response) -> bool:
    """A 404 that says the job expired (the native envelope's `code` is the status)."""
    return response.status_code == 404 and " expired" in response.json()["error"]["message"]


def test_a_client_polling_across_the_ttl_never_sees_completed_without_content(server, http):
    job = http.post("/v1/videos", json=VIDEO).json()
    job = wait_status(server.base_url, job["id"], {"completed"}, timeout_s=120)
    path = server.workdir / "outputs" / f"{job['id']}.mp4"
    polls: list[tuple[int, int]] = []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        seen = http.get(f"/v1/videos/{job['id']}")
        if seen.status_code == 200:
            assert seen.json()["status"] == "completed"
            content = http.get(f"/v1/videos/{job['id']}/content")
            # a 404 here only when the TTL passed between the two calls, and then it says so
            assert content.status_code == 200 or says_expired(content), content.text
            polls.append((200, content.status_code))
        else:
            assert says_expired(seen), seen.text
            assert "output_ttl_s=2" in seen.json()["error"]["message"]
            polls.append((404, 404))
            if not path.exists():
                break  # swept: the file is gone and the job is still answered `expired`
        time.sleep(0.05)
    assert polls[0] == (200, 200) and polls[-1] == (404, 404) and not path.exists()
    assert job["id"] not in {j["id"] for j in http.get("/v1/videos").json()["data"]}
    # files removed behind the server's back: the job goes too (never completed + 404 content)
    other = wait_status(server.base_url, http.post("/v1/videos", json=VIDEO).json()["id"],
                        {"completed"}, timeout_s=120)
    (server.workdir / "outputs" / f"{other['id']}.mp4").unlink()
    assert says_expired(http.get(f"/v1/videos/{other['id']}"))
    assert says_expired(http.get(f"/v1/videos/{other['id']}/content"))


@pytest.mark.parametrize("route, body", [
    ("/v1/videos", {**VIDEO, "size": "1280x720", "num_frames": 189}),
    ("/v1/videos/sync", {**VIDEO, "size": "1280x720", "num_frames": 189}),
    ("/v1/images/generations", {"prompt": "x", "size": "1280x720"}),
])
def test_a_request_past_the_model_limits_is_a_400_naming_them(http, route, body):
    response = http.post(route, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "width"
    assert "width <= 256, height <= 256" in error["message"]  # the dev checkpoint's limits


def test_the_nim_infer_route_names_the_limits_too(http):
    # the Wan dev checkpoint serves the NIM's keys at the table's size: 720 is 1280x720
    response = http.post("/v1/infer", json={"model_mode": "text2video", "prompt": "x",
                                            "resolution": "720", "num_frames": 189})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == "width" and "width <= 256" in error["message"]


def test_the_limits_asked_exactly(http):
    at_limit = {**VIDEO, "size": "80x80", "num_frames": 397, "num_inference_steps": 1}
    job = http.post("/v1/videos", json=at_limit)
    assert job.status_code == 200, job.text
    one_over = http.post("/v1/videos", json={**at_limit, "num_frames": 401})
    assert one_over.status_code == 400 and one_over.json()["error"]["param"] == "num_frames"
    assert http.delete(f"/v1/videos/{job.json()['id']}").status_code == 200
    side = {"prompt": "x", "num_inference_steps": 1}
    assert http.post("/v1/images/generations", json={**side, "size": "256x256"}).status_code == 200
    wider = http.post("/v1/images/generations", json={**side, "size": "272x256"})
    assert wider.status_code == 400 and wider.json()["error"]["param"] == "width"
