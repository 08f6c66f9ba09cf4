"""worldserve on Ray Serve (`--cluster ray`), on CPU: a local Ray instance (2 CPUs, no
dashboard), 2 replicas each of the fake reasoner, the fake realtime engine and the sleep
generation engine behind 2 api replicas, all deployed once for this module. With 2 api
replicas, every REST call on a session or job also has to reach the api replica that holds its
record (the `ApiRouter`). Real actors, real HTTP and WebSockets through Serve's
proxy; the engines are the fakes (the boundary these tests are not about).

Order matters: the fault test kills replicas and runs last.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import httpx
import pytest
import websockets
from PIL import Image
from websockets.sync.client import ClientConnection, connect

from tests.integration.realtime.helpers import Session
from tests.support.server import free_port

try:  # no skip: `make test` installs the ray extra, and these tests must run in CI
    import ray
except ImportError as exc:  # pragma: no cover
    raise ImportError("tests/integration/cluster need the ray extra: "
                      "pip install -e '.[dev,ray]'") from exc

from worldserve.cluster.app import (  # noqa: E402
    ROUTING_STATS_PERIOD_S,
    ClusterOptions,
    deploy,
    shutdown,
)
from worldserve.cluster.ids import owner_of  # noqa: E402
from worldserve.config import ServerConfig  # noqa: E402

SLEEP_ENGINE = "worldserve.cluster.fake:SleepGenerationEngine"
SESSION = {"system_prompt": "Describe each frame in one short sentence."}
NUM_FRAMES = 20
LOST = "session lost, create a new one"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("cluster")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    port = free_port()  # after Ray's own services took theirs
    config = ServerConfig.model_validate({"port": port, "stages": {
        "generation": {"model_path": str(workdir), "output_dir": str(workdir / "out")},
        "reasoner": {"backend": "fake", "model_path": str(workdir), "streaming": {}},
        "realtime": {"backend": "fake", "model_path": str(workdir)}}})
    options = ClusterOptions(replicas={"generation": 2, "reasoner": 2, "realtime": 2},
                             api_replicas=2, engine_targets={"generation": SLEEP_ENGINE})
    try:
        deploy(config, None, options)
        yield f"127.0.0.1:{port}"
    finally:
        shutdown()
        ray.shutdown()


@pytest.fixture
def http(cluster: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://{cluster}", timeout=30) as client:
        yield client


def jpeg(seed: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), ((seed * 37) % 256, (seed * 91) % 256, 128)).save(out, "JPEG")
    return out.getvalue()


def rest_session(http: httpx.Client) -> str:
    response = http.post("/v1/streaming/sessions", json=SESSION)
    assert response.status_code == 201, response.text
    return response.json()["session_id"]


def rest_frame(http: httpx.Client, session_id: str, seed: int) -> httpx.Response:
    return http.post(f"/v1/streaming/sessions/{session_id}/frame", content=jpeg(seed),
                     headers={"content-type": "image/jpeg"})


def ws_session(cluster: str) -> tuple[ClientConnection, str]:
    ws = connect(f"ws://{cluster}/v1/streaming/ws", max_size=None, open_timeout=30)
    ws.send(json.dumps({"op": "create", **SESSION}))
    created = json.loads(ws.recv(timeout=30))
    assert created["op"] == "created", created
    return ws, created["session_id"]


def ws_frame(ws: ClientConnection, seed: int) -> dict[str, Any]:
    ws.send(jpeg(seed))
    return json.loads(ws.recv(timeout=30))


def replica_actors(stage: str) -> dict[str, Any]:
    """Live replica actors of a stage deployment, by replica id."""
    found = {}
    for entry in ray.util.list_named_actors(all_namespaces=True):
        name = entry["name"]
        if name.startswith(f"SERVE_REPLICA::worldserve-{stage}#{stage}#"):
            found[name.rsplit("#", 1)[1]] = ray.get_actor(name, namespace=entry["namespace"])
    return found


def finished(http: httpx.Client, job_id: str, timeout_s: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = http.get(f"/v1/videos/{job_id}").json()
        if job["status"] not in ("queued", "in_progress"):
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not finish")


def test_rest_sessions_stay_on_their_owner(http: httpx.Client) -> None:
    sessions = [rest_session(http)]
    # Two api replicas each route: the second placement must see the first one through the
    # replicas' routing stats (published every ROUTING_STATS_PERIOD_S).
    time.sleep(3 * ROUTING_STATS_PERIOD_S)
    sessions.append(rest_session(http))
    owners = {owner_of(s) for s in sessions}
    assert owners == set(replica_actors("reasoner")), "sessions were not spread over both"
    # The fake engine numbers a session's frames; a replica that does not hold the session
    # answers not_found (409 here), so 20 consecutive indexes mean 20 calls on the owner.
    for index in range(NUM_FRAMES):
        for session_id in sessions:
            response = rest_frame(http, session_id, index)
            assert response.status_code == 200, response.text
            assert response.json()["frame_index"] == index
    for session_id in sessions:
        assert http.delete(f"/v1/streaming/sessions/{session_id}").json()["frames"] == NUM_FRAMES


def test_websocket_sessions_through_the_ingress(cluster: str) -> None:
    connections = [ws_session(cluster) for _ in range(2)]
    assert {owner_of(sid) for _, sid in connections} <= set(replica_actors("reasoner"))
    for index in range(NUM_FRAMES):
        for ws, _ in connections:
            reply = ws_frame(ws, index)
            assert (reply["op"], reply["frame_index"]) == ("frame", index), reply
    for ws, _ in connections:
        ws.send(json.dumps({"op": "delete"}))
        assert json.loads(ws.recv(timeout=30))["frames"] == NUM_FRAMES
        ws.close()


async def realtime_session(cluster: str, prompt: str) -> tuple[list[int], int, str]:
    """One realtime world session of NUM_FRAMES chunks: (chunk indexes, close code, reason)."""
    url = f"ws://{cluster}/v1/realtime_video/generate"
    async with websockets.connect(url, max_size=None, close_timeout=2) as ws:
        session = Session(ws)
        await session.send({"type": "init", "prompt": prompt, "size": "32x32",
                            "max_chunks": NUM_FRAMES})
        chunks, code, reason = await session.read_until_close(timeout_s=30)
    assert not session.errors, session.errors
    return [c.index for c in chunks], code, reason


async def test_realtime_sessions_stay_on_their_owner(cluster: str) -> None:
    """Chunk k > 0 of a session its replica does not hold fails (not_found): 20 chunks and a
    normal close mean every chunk ran on the owner."""
    done = await asyncio.gather(*(realtime_session(cluster, f"world {i}") for i in range(2)))
    for indexes, code, reason in done:
        assert indexes == list(range(NUM_FRAMES))
        assert (code, reason) == (1000, "generation complete")


def test_jobs_spread_over_both_replicas(http: httpx.Client) -> None:
    """Bursts of 4 jobs until both replicas wrote one (at most 3 bursts): the power of two
    choices can send a burst to one replica when their queues look alike (a loaded machine did,
    once), but not three in a row unless routing never spreads."""
    body = {"prompt": "a cube", "size": "64x64", "num_inference_steps": 10}
    writers: set[bytes] = set()
    for _ in range(3):
        with ThreadPoolExecutor(4) as pool:
            jobs = list(pool.map(lambda _: http.post("/v1/videos", json=body).json(), range(4)))
        for job in jobs:
            job = finished(http, job["id"])
            assert job["status"] == "completed", job
            assert job["url"].startswith("http://")
            content = http.get(job["url"])
            assert content.status_code == 200
            writers.add(content.content)
        if len(writers) == 2:
            break
    assert len(writers) == 2, f"every job ran on one replica: {writers}"


def walk(http: httpx.Client, order: str, limit: int) -> list[dict[str, Any]]:
    """Every job of `GET /v1/videos`, page by page (`after` = the previous page's last id)."""
    jobs: list[dict[str, Any]] = []
    params: dict[str, Any] = {"order": order, "limit": limit}
    while True:
        page = http.get("/v1/videos", params=params).json()
        assert "data" in page, page
        assert len(page["data"]) <= limit
        jobs += page["data"]
        if not page["has_more"]:
            return jobs
        params["after"] = page["last_id"]


def test_the_video_list_merges_every_api_replica(http: httpx.Client) -> None:
    """Each api replica holds the records of the jobs it created; any replica answers the list
    with all of them, ordered and paginated as on one node (cluster/listing.py)."""
    body = {"prompt": "listed", "size": "64x64", "num_inference_steps": 1}
    created: set[str] = set()
    while len(created) < 8 or len({job_id.rsplit(".", 1)[1] for job_id in created}) < 2:
        assert len(created) < 40, "the creates all reached one api replica"
        created.add(http.post("/v1/videos", json=body).json()["id"])
    for _ in range(3):  # whichever api replica answers (the list is not pinned)
        newest_first = walk(http, "desc", limit=3)
        ids = [job["id"] for job in newest_first]
        assert created <= set(ids) and len(ids) == len(set(ids))
        assert [job["created_at"] for job in newest_first] == sorted(
            (job["created_at"] for job in newest_first), reverse=True)
        assert [job["id"] for job in walk(http, "asc", limit=5)] == ids[::-1]
    assert all(job["url"] is None or job["url"].startswith("http://") for job in newest_first)


def test_deleting_a_running_job_stops_it_on_its_replica(http: httpx.Client) -> None:
    """Six 20-s jobs keep both replicas busy for a minute (all six on one replica: 1 in 32);
    deleting them must reach their replicas (the cancel is pinned to the owner), or the next
    short job would wait for them."""
    slow = {"prompt": "slow", "size": "64x64", "num_inference_steps": 400}
    jobs = [http.post("/v1/videos", json=slow).json() for _ in range(6)]
    deadline = time.monotonic() + 30
    while sum(http.get(f"/v1/videos/{j['id']}").json()["progress"] > 0 for j in jobs) < 2:
        assert time.monotonic() < deadline, "the slow jobs did not start"
        time.sleep(0.05)
    started = time.monotonic()  # a delete waits for the stage to stop the job
    for job in jobs:
        assert http.delete(f"/v1/videos/{job['id']}").status_code == 200
    quick = http.post("/v1/videos", json={"prompt": "quick", "size": "64x64",
                                          "num_inference_steps": 2}).json()
    assert finished(http, quick["id"])["status"] == "completed"
    assert time.monotonic() - started < 8.0, "a deleted job kept its replica busy"


def test_owner_death_answers_410_at_once_and_fails_its_jobs(http: httpx.Client,
                                                             cluster: str) -> None:
    rest_id = rest_session(http)
    owner = owner_of(rest_id)
    ws, ws_id = ws_session(cluster)
    for _ in range(3):  # placement alternates: find a WebSocket session on the same owner
        if owner_of(ws_id) == owner:
            break
        ws.close()
        ws, ws_id = ws_session(cluster)
    assert owner_of(ws_id) == owner
    assert rest_frame(http, rest_id, 0).status_code == 200
    assert ws_frame(ws, 0)["op"] == "frame"
    job = http.post("/v1/videos", json={"prompt": "slow", "size": "64x64",
                                        "num_inference_steps": 400}).json()

    ray.kill(replica_actors("reasoner")[owner])
    for actor in replica_actors("generation").values():
        ray.kill(actor)

    started = time.monotonic()
    response = rest_frame(http, rest_id, 1)
    assert response.status_code == 410, response.text
    assert LOST in response.text
    error = ws_frame(ws, 1)
    assert (error["op"], error["code"], error["fatal"]) == ("error", 410, True), error
    assert LOST in error["message"]
    with pytest.raises(Exception):
        ws.recv(timeout=10)
    assert ws.close_code == 1008
    assert time.monotonic() - started < 5.0, "the 410s were not immediate"

    failed = finished(http, job["id"])
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == "replica_lost", failed
    # A new session works (on the survivor, or on the replica Ray started, under a new id).
    new_id = rest_session(http)
    assert owner_of(new_id) != owner
    assert rest_frame(http, new_id, 0).status_code == 200
