"""Mixed load on one server over loopback: nothing lost, no 500, memory flat.

N concurrent clients (default 200) for a bounded duration (default 60 s; the run stops by
itself) mix image requests, video jobs, live-reasoning WebSocket sessions and realtime
WebSocket sessions (when the server has the realtime route). The server is started here with
the dev checkpoints (generation), the `fake` or `hf` reasoner (--reasoner-backend) and the
`fake` realtime backend. Reports per route: requests/s, p50/p99 latency, responses by status;
video jobs accepted vs jobs that reached a terminal state (must be equal); RSS of the api
process, every stage and this client, at start and end.

    .venv/bin/python benchmarks/load.py [--clients 200] [--duration 60] [--reasoner-backend fake]

Prints one JSON line at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx
import msgpack
import websockets
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402
from tests.support.server import ServerProcess  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
HAS_REALTIME = (REPO / "worldserve" / "api" / "routes" / "realtime.py").exists()
TERMINAL = ("completed", "failed", "cancelled")


def jpeg(seed: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), (seed * 37 % 256, 90, 160)).save(out, "JPEG")
    return out.getvalue()


def rss_mb(pid: int) -> float:
    """harness.rss_mb for this line: -1 once the process is gone."""
    mb = harness.rss_mb(pid)
    return -1.0 if mb is None else round(mb, 1)


class Stats:
    """Latency and status per route; video jobs accepted and their ids."""

    def __init__(self) -> None:
        self.latency_ms: dict[str, list[float]] = defaultdict(list)
        self.status: dict[str, Counter] = defaultdict(Counter)
        self.video_ids: list[str] = []

    def record(self, route: str, started: float, status: int | str) -> None:
        self.latency_ms[route].append((time.perf_counter() - started) * 1000)
        self.status[route][str(status)] += 1

    def report(self, duration_s: float) -> dict[str, Any]:
        out = {}
        for route, values in sorted(self.latency_ms.items()):
            ordered = sorted(values)
            out[route] = {
                "requests": len(values),
                "rps": round(len(values) / duration_s, 2),
                "p50_ms": round(statistics.median(ordered), 1),
                "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 1),
                "by_status": dict(self.status[route]),
            }
        return out


async def image(http: httpx.AsyncClient, stats: Stats, rng: random.Random) -> None:
    started = time.perf_counter()
    body = {
        "prompt": "a red car",
        "size": "64x64",
        "num_inference_steps": 2,
        "seed": rng.randrange(1000),
        "response_format": "b64_json",
    }
    try:
        status = (await http.post("/v1/images/generations", json=body)).status_code
    except httpx.HTTPError as exc:
        status = type(exc).__name__
    stats.record("POST /v1/images/generations", started, status)


async def video(http: httpx.AsyncClient, stats: Stats, rng: random.Random) -> None:
    started = time.perf_counter()
    body = {
        "prompt": "a red car",
        "size": "64x64",
        "num_frames": 5,
        "num_inference_steps": 2,
        "seed": rng.randrange(1000),
    }
    try:
        response = await http.post("/v1/videos", json=body)
        status: int | str = response.status_code
        if status == 200:
            stats.video_ids.append(response.json()["id"])
    except httpx.HTTPError as exc:
        status = type(exc).__name__
    stats.record("POST /v1/videos", started, status)


async def reasoning(ws_url: str, stats: Stats, rng: random.Random) -> None:
    """One live-reasoning session over the WebSocket: create, 3 frames, delete."""
    started = time.perf_counter()
    status: int | str = "ok"
    try:
        async with websockets.connect(ws_url + "/v1/streaming/ws", max_size=None) as ws:
            await ws.send(
                json.dumps(
                    {"op": "create", "system_prompt": "describe", "sampling": {"max_tokens": 4}}
                )
            )
            reply = json.loads(await ws.recv())
            if reply["op"] != "created":
                status = reply.get("code", "error")
            else:
                for i in range(3):
                    frame_started = time.perf_counter()
                    await ws.send(jpeg(rng.randrange(1000)))
                    answer = json.loads(await ws.recv())
                    stats.record(
                        "WS /v1/streaming/ws frame",
                        frame_started,
                        "ok" if answer["op"] == "frame" else answer.get("code"),
                    )
                await ws.send(json.dumps({"op": "delete"}))
                await ws.recv()
    except (OSError, websockets.WebSocketException) as exc:
        status = getattr(getattr(exc, "rcvd", None), "code", type(exc).__name__)
    stats.record("WS /v1/streaming/ws session", started, status)


async def realtime(ws_url: str, stats: Stats, rng: random.Random) -> None:
    """One realtime session: init with max_chunks 2, read until the server closes."""
    started = time.perf_counter()
    init = {
        "type": "init",
        "prompt": "a corridor",
        "max_chunks": 2,
        "size": "64x64",
        "seed": rng.randrange(1000),
    }
    status: int | str = "ok"
    try:
        async with websockets.connect(ws_url + "/v1/realtime_video/generate", max_size=None) as ws:
            await ws.send(msgpack.packb(init))
            try:
                while True:
                    message = await ws.recv()
                    try:  # msgpack maps; the raw payload after a batch header is not one
                        decoded = msgpack.unpackb(message, raw=False)
                    except (ValueError, msgpack.UnpackException, TypeError):
                        continue
                    if isinstance(decoded, dict) and decoded.get("type") == "error":
                        status = decoded.get("code", "error")
            except websockets.ConnectionClosed as closed:
                code = closed.rcvd.code if closed.rcvd else None
                if code != 1000:
                    status = code if status == "ok" else status
    except (OSError, websockets.WebSocketException) as exc:
        status = type(exc).__name__
    stats.record("WS /v1/realtime_video/generate session", started, status)


async def client(
    index: int,
    args: argparse.Namespace,
    server: ServerProcess,
    http: httpx.AsyncClient,
    stats: Stats,
    stop_at: float,
) -> None:
    rng = random.Random(index)
    kinds = ["image", "video", "reasoning"] + (["realtime"] if args.realtime else [])
    weights = [3, 2, 3] + ([2] if args.realtime else [])
    while time.monotonic() < stop_at:
        kind = rng.choices(kinds, weights)[0]
        if kind == "image":
            await image(http, stats, rng)
        elif kind == "video":
            await video(http, stats, rng)
        elif kind == "reasoning":
            await reasoning(server.ws_url, stats, rng)
        else:
            await realtime(server.ws_url, stats, rng)
        await asyncio.sleep(args.think_ms / 1000 * (0.5 + rng.random()))


async def settle_jobs(http: httpx.AsyncClient, ids: list[str], timeout_s: float) -> Counter:
    """Poll every accepted video job until it is terminal (bounded); returns final statuses."""
    final: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    while len(final) < len(ids) and time.monotonic() < deadline:
        for job_id in [i for i in ids if i not in final]:
            response = await http.get(f"/v1/videos/{job_id}")
            status = response.json()["status"] if response.status_code == 200 else "missing"
            if status in TERMINAL or status == "missing":
                final[job_id] = status
        await asyncio.sleep(0.5)
    return Counter(final.get(i, "not_terminal") for i in ids)


def process_rss(server: ServerProcess) -> dict[str, float]:
    out = {"api": rss_mb(server.proc.pid)}
    for name, pid in server.stage_pids().items():
        if pid:
            out[name] = rss_mb(pid)
    out["load_client"] = rss_mb(os.getpid())
    return out


async def run(args: argparse.Namespace, server: ServerProcess) -> dict[str, Any]:
    stats = Stats()
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(
        base_url=server.base_url, timeout=args.request_timeout, limits=limits
    ) as http:
        rss_start = process_rss(server)
        started = time.monotonic()
        stop_at = started + args.duration
        tasks = [
            asyncio.create_task(client(i, args, server, http, stats, stop_at))
            for i in range(args.clients)
        ]
        done, pending = await asyncio.wait(tasks, timeout=args.duration + args.grace)
        for task in pending:  # requests still running past the grace period
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        elapsed = time.monotonic() - started
        jobs = await settle_jobs(http, stats.video_ids, args.job_timeout)
        health = (await http.get("/health")).status_code
        rss_end = process_rss(server)
    statuses = Counter()
    for counter in stats.status.values():
        statuses.update(counter)
    terminal = sum(n for s, n in jobs.items() if s in TERMINAL)
    return {
        "clients": args.clients,
        "duration_s": round(elapsed, 1),
        "reasoner_backend": args.reasoner_backend,
        "realtime": args.realtime,
        "routes": stats.report(elapsed),
        "total_requests": sum(statuses.values()),
        "server_errors_500": statuses.get("500", 0),
        "client_tasks_cut_at_grace": len(pending),
        "video_jobs_accepted": len(stats.video_ids),
        "video_jobs_terminal": terminal,
        "video_jobs_by_status": dict(jobs),
        "nothing_lost": terminal == len(stats.video_ids),
        "health_after": health,
        "rss_mb_start": rss_start,
        "rss_mb_end": rss_end,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    parser.add_argument("--think-ms", type=float, default=100.0, help="pause between requests")
    parser.add_argument("--grace", type=float, default=60.0, help="wait for in-flight work")
    parser.add_argument("--job-timeout", type=float, default=180.0)
    parser.add_argument("--request-timeout", type=float, default=120.0)
    parser.add_argument("--reasoner-backend", choices=["fake", "hf"], default="fake")
    parser.add_argument(
        "--realtime",
        action=argparse.BooleanOptionalAction,
        default=HAS_REALTIME,
        help="realtime sessions (fake backend); default: when the route exists",
    )
    args = parser.parse_args()
    root = harness.dev_models_dir()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        stages: dict[str, Any] = {
            "generation": {"model_path": str(root / "generation")},
            "reasoner": {
                "backend": args.reasoner_backend,
                "model_path": str(root / "reasoner")
                if args.reasoner_backend == "hf"
                else str(workdir),
            },
            "realtime": {"enabled": True, "backend": "fake", "model_path": str(workdir)}
            if args.realtime
            else {"enabled": False},
        }
        with harness.server(workdir, {"stages": stages}) as server:
            result = asyncio.run(run(args, server))
            result["server_alive"] = server.proc.poll() is None
    harness.emit(result, stderr_too=True)


if __name__ == "__main__":
    main()
