"""Cadence of both realtime protocols in one run, from the client (`realtime.py --protocols`).

One live server on the dev realtime checkpoint (the causal backend; `--backend fake` for the
synthetic one); `--sessions` sessions of `--protocol-chunks` chunks each through SGLang's
`/v1/realtime_video/generate` (raw frames) and then vLLM-Omni's `/v1/realtime/video` (fMP4),
same prompt, seeds and camera script. Per protocol: time to first chunk (from the start
message), inter-chunk interval p50/p99, real-time factor (media seconds / wall seconds after
the first chunk) and stalls (api/realtime/cadence.py's rule, replayed on the client's clock),
plus the server's own `/metrics` counts for the same sessions.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import msgpack
from prometheus_client import CollectorRegistry
from websockets.sync.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks.*
from benchmarks import harness  # noqa: E402
from worldserve.api.metrics import RealtimeCadenceMetrics  # noqa: E402
from worldserve.api.realtime.cadence import CadenceTracker  # noqa: E402

PROMPT = "a road through a forest"
ACTION = "w-12,l-12"


def sglang_session(url: str, seed: int, num_chunks: int) -> tuple[float, list[tuple[float, int]]]:
    """(start time, [(arrival, frames)]) of one SGLang session; a chunk arrives with its stats."""
    with connect(url + "/v1/realtime_video/generate", max_size=None) as ws:
        started = time.monotonic()
        ws.send(msgpack.packb({"type": "init", "prompt": PROMPT, "seed": seed,
                               "max_chunks": num_chunks,
                               "condition_inputs": {"action": ACTION}}))
        arrivals = []
        while len(arrivals) < num_chunks:
            message = msgpack.unpackb(ws.recv(), raw=False)
            if message.get("type") == "chunk_stats":
                arrivals.append((time.monotonic(), message["num_frames"]))
            elif message.get("type") == "frame_batch_header":
                ws.recv()  # its raw payload
            elif message.get("type") == "error":
                raise RuntimeError(message)
    return started, arrivals


def omni_session(url: str, seed: int, num_chunks: int) -> tuple[float, list[tuple[float, int]]]:
    """The same for vLLM-Omni: a chunk arrives with its binary fMP4 frame."""
    with connect(url + "/v1/realtime/video", max_size=None) as ws:
        started = time.monotonic()
        ws.send(json.dumps({"type": "session.start", "prompt": PROMPT, "seed": seed,
                            "extra_params": {"sana_wm": {"action": ACTION}}}))
        arrivals, frames = [], 0
        while len(arrivals) < num_chunks:
            message = ws.recv()
            if isinstance(message, bytes):
                arrivals.append((time.monotonic(), frames))
                continue
            body = json.loads(message)
            if body["type"] == "video.chunk_metadata":
                frames = body["num_frames"]
            elif body["type"] == "error":
                raise RuntimeError(body)
        ws.send(json.dumps({"type": "session.stop"}))
    return started, arrivals


def warm_up(url: str) -> float:
    """One short session (first-call costs, not measured); returns the sessions' fps, as the
    server's `video.start` reports it."""
    with connect(url + "/v1/realtime/video", max_size=None) as ws:
        ws.send(json.dumps({"type": "session.start", "prompt": PROMPT, "seed": 0}))
        fps = float(json.loads(ws.recv())["config"]["fps"])
        while not isinstance(ws.recv(), bytes):
            pass
        ws.send(json.dumps({"type": "session.stop"}))
    return fps


def figures(runs: list[tuple[float, list[tuple[float, int]]]], fps: float) -> dict[str, Any]:
    registry = CollectorRegistry()
    metrics = RealtimeCadenceMetrics(registry)
    first, intervals, media_s, wall_s = [], [], 0.0, 0.0
    for started, arrivals in runs:
        tracker = CadenceTracker("client", fps, metrics, started_at=started)
        for at, frames in arrivals:
            tracker.chunk_sent(frames, now=at)
        first.append(arrivals[0][0] - started)
        intervals += [b[0] - a[0] for a, b in zip(arrivals, arrivals[1:])]
        media_s += sum(frames for _, frames in arrivals[1:]) / fps
        wall_s += arrivals[-1][0] - arrivals[0][0]
    stalls = registry.get_sample_value("worldserve_realtime_stalls_total",
                                       {"protocol": "client"}) or 0
    return {"first_chunk_s_median": harness.median(first),
            "interval_ms_p50": 1000 * harness.percentile(intervals, 0.5),
            "interval_ms_p99": 1000 * harness.percentile(intervals, 0.99),
            "realtime_factor": media_s / wall_s if wall_s else 0.0, "stalls": int(stalls)}


def server_counts(base_url: str) -> dict[str, float]:
    """The server's cadence counts per protocol, from /metrics."""
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    counts = {}
    for line in text.splitlines():
        for name in ("first_chunk_seconds_count", "chunk_interval_seconds_count", "stalls_total"):
            if line.startswith(f"worldserve_realtime_{name}{{"):
                protocol = line.split('protocol="')[1].split('"')[0]
                counts[f"server_{protocol}_{name}"] = float(line.split()[-1])
    return counts


def protocols_main(args: argparse.Namespace) -> None:
    realtime: dict[str, Any] = {"enabled": True, "backend": args.backend}
    if args.backend != "fake":
        realtime["model_path"] = harness.default_stages()["realtime"]["model_path"]
    config = {"stages": {"generation": {"enabled": False}, "reasoner": {"enabled": False},
                         "realtime": realtime}}
    result: dict[str, Any] = {"backend": args.backend, "sessions": args.sessions,
                              "chunks": args.protocol_chunks}
    with tempfile.TemporaryDirectory() as tmp, \
            harness.server(Path(tmp), config, threads=args.threads) as server:
        fps = warm_up(server.ws_url)
        for name, run in (("sglang", sglang_session), ("vllm_omni", omni_session)):
            runs = [run(server.ws_url, seed, args.protocol_chunks)
                    for seed in range(1, args.sessions + 1)]
            result.update({f"{name}_{k}": v for k, v in figures(runs, fps).items()})
            print(name, json.dumps(result), file=sys.stderr)
        result.update(server_counts(server.base_url))
    harness.emit(harness.rounded(result))
