"""`worldserve serve --cluster ray` on the real dev engines (the dev Cosmos3 default: Cosmos3
generation and reasoner, the dev causal realtime model), 2 generation replicas, 2 api replicas,
started once for this module through the command line, as a user would. Every output is
downloaded from its absolute `url`. The models are tiny and random: the tests assert structure
and equivalences (a seeded image is the same bytes from either generation replica; a greedy
session answers the same over REST and over the WebSocket), never content.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import websockets
from PIL import Image
from websockets.sync.client import connect

from tests.integration.realtime.helpers import Session
from tests.support.server import base_env, free_port
from worldserve.media.video import decode_audio, decode_frames
from worldserve.models.dev import WORLD_SAMPLING_DEFAULTS

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

NUM_FRAMES = 20
GREEDY_SESSION = {"system_prompt": "Describe each frame in one short sentence.",
                  "sampling": {"temperature": 0, "max_tokens": 8}}
START_TIMEOUT_S = 600.0


class ClusterServer:
    """One `python -m worldserve serve --cluster ray` process (its own local Ray instance)."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "cluster.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "worldserve", "serve", "--cluster", "ray",
             "--replicas", "generation=2", "--api-replicas", "2", "--port", str(self.port),
             "--output-dir", str(workdir / "outputs")],
            cwd=workdir, stdout=self._log, stderr=subprocess.STDOUT, env=base_env(),
            start_new_session=True)  # Ray's own processes go with it on teardown

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the server exited:\n{self.log()[-5000:]}"
            try:
                if httpx.get(f"{self.base_url}/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise TimeoutError(f"not healthy after {START_TIMEOUT_S} s:\n{self.log()[-5000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # undeploys and stops its Ray instance
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, dev_models_dir: Path) -> Iterator[str]:
    server = ClusterServer(tmp_path_factory.mktemp("ray-real"))
    try:
        server.wait_healthy()
        yield server.base_url
    finally:
        server.stop()


@pytest.fixture
def http(cluster: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=cluster, timeout=120) as client:
        yield client


def jpeg(seed: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), ((seed * 37) % 256, (seed * 91) % 256, 128)).save(out, "JPEG")
    return out.getvalue()


def png_data_url() -> str:
    out = io.BytesIO()
    Image.new("RGB", (56, 40), (30, 160, 90)).save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def finished(http: httpx.Client, job_id: str, timeout_s: float = 300.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = http.get(f"/v1/videos/{job_id}").json()
        if job["status"] not in ("queued", "in_progress"):
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not finish")


def test_seeded_images_are_the_same_bytes_from_either_replica(http: httpx.Client,
                                                               cluster: str) -> None:
    body = {"prompt": "a red cube", "seed": 7, "response_format": "url"}
    with ThreadPoolExecutor(4) as pool:  # 4 at once: both replicas get some (all on one: 1/8)
        answers = list(pool.map(lambda _: http.post("/v1/images/generations", json=body),
                                range(4)))
    images = []
    for answer in answers:
        assert answer.status_code == 200, answer.text
        url = answer.json()["data"][0]["url"]
        assert url.startswith(f"{cluster}/v1/images/")  # absolute, through the entry point
        content = http.get(url)
        assert content.status_code == 200 and content.content[:4] == b"\x89PNG"
        images.append(content.content)
    assert len(set(images)) == 1
    # the default dev model's default size (the trained world/ checkpoint's marker)
    assert Image.open(io.BytesIO(images[0])).size == (WORLD_SAMPLING_DEFAULTS["image_width"],
                                                      WORLD_SAMPLING_DEFAULTS["image_height"])


def test_a_video_with_sound_downloads_from_its_url(http: httpx.Client, cluster: str) -> None:
    created = http.post("/v1/videos", json={"prompt": "a robot", "size": "48x32",
                                            "num_frames": 9, "generate_sound": True})
    assert created.status_code == 200, created.text
    job_id = created.json()["id"]
    assert "." in job_id  # tagged with its api replica: the output stem check accepts it
    job = finished(http, job_id)
    assert job["status"] == "completed", job
    assert job["url"] == f"{cluster}/v1/videos/{job_id}/content"
    data = http.get(job["url"]).content
    assert len(decode_frames(data)) == 9 and decode_audio(data) is not None
    listed = http.get("/v1/videos", params={"limit": 100}).json()["data"]
    assert job_id in [item["id"] for item in listed]


def test_a_policy_action_request(http: httpx.Client) -> None:
    answer = http.post("/v1/actions/generations", json={
        "input": {"task": "pick", "image": png_data_url()},
        "parameters": {"domain_name": "pusht", "action_horizon": 4, "resolution_tier": 256}})
    assert answer.status_code == 200, answer.text
    assert answer.json()["data"][0]["action"]["shape"] == [4, 2]


def test_a_greedy_session_answers_the_same_over_rest_and_websocket(http: httpx.Client,
                                                                   cluster: str) -> None:
    created = http.post("/v1/streaming/sessions", json=GREEDY_SESSION)
    assert created.status_code == 201, created.text
    rest_id = created.json()["session_id"]
    ws = connect(f"{cluster.replace('http', 'ws')}/v1/streaming/ws", max_size=None,
                 open_timeout=60)
    ws.send(json.dumps({"op": "create", **GREEDY_SESSION}))
    assert json.loads(ws.recv(timeout=60))["op"] == "created"
    for index in range(NUM_FRAMES):  # interleaved: one frame on each session in turn
        rest = http.post(f"/v1/streaming/sessions/{rest_id}/frame", content=jpeg(index),
                         headers={"content-type": "image/jpeg"})
        assert rest.status_code == 200, rest.text
        ws.send(jpeg(index))
        socket = json.loads(ws.recv(timeout=60))
        assert (rest.json()["frame_index"], socket["frame_index"]) == (index, index)
        assert socket["text"] == rest.json()["text"]
    assert http.delete(f"/v1/streaming/sessions/{rest_id}").json()["frames"] == NUM_FRAMES
    ws.send(json.dumps({"op": "delete"}))
    assert json.loads(ws.recv(timeout=60))["frames"] == NUM_FRAMES
    ws.close()


async def test_a_realtime_session_streams_its_chunks(cluster: str) -> None:
    url = f"{cluster.replace('http', 'ws')}/v1/realtime_video/generate"
    async with websockets.connect(url, max_size=None, close_timeout=5) as ws:
        session = Session(ws)
        await session.send({"type": "init", "prompt": "a castle", "max_chunks": 2,
                            "condition_inputs": {"action": "w-4,d-4"}})
        chunks, code, reason = await asyncio.wait_for(session.read_until_close(timeout_s=300),
                                                      320)
    assert not session.errors, session.errors
    assert [chunk.index for chunk in chunks] == [0, 1]
    assert (code, reason) == (1000, "generation complete")
    assert all(chunk.frames.ndim == 4 and chunk.frames.shape[-1] == 3 for chunk in chunks)
