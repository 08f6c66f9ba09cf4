"""Scale-out on Ray Serve (`--cluster ray`): throughput with 1 and 2 generation replicas, and the
latency the Ray path adds over the single-node path for one small request.

(a) throughput: --jobs image requests (`POST /v1/images/generations`), --concurrency at a time,
    against 1 and then 2 replicas of the sleep-based generation engine (each denoising step
    blocks its replica for 50 ms, as a busy device would; --steps per job), through the api
    ingress; the ratio of jobs/s (aim >= 1.8);
(b) added latency: one frame of a REST streaming session on the fake reasoner (tiny JPEG), --n
    sequential frames on the single-node server (`worldserve serve`, ZeroMQ stage process) and
    on the Ray path (Serve proxy -> api replica -> reasoner replica); p50/p99 of both.

    .venv/bin/python benchmarks/scale_out.py [--jobs 24] [--concurrency 8] [--steps 20] [--n 200]

Needs the ray extra. Prints one JSON line at the end.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ray  # noqa: E402
from ray import serve  # noqa: E402

from benchmarks import harness  # noqa: E402
from tests.support.server import free_port  # noqa: E402
from worldserve.cluster.app import (  # noqa: E402
    ClusterOptions,
    deploy,
    shutdown,
    stage_app_name,
    stage_application,
)
from worldserve.config import ServerConfig  # noqa: E402

SLEEP_ENGINE = "worldserve.cluster.fake:SleepGenerationEngine"
SESSION = {"system_prompt": "Describe each frame."}


def jpeg() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), (90, 30, 128)).save(out, "JPEG")
    return out.getvalue()


def percentiles(samples_ms: list[float]) -> dict[str, float]:
    ordered = sorted(samples_ms)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {"p50_ms": round(statistics.median(ordered), 2), "p99_ms": round(p99, 2)}


def frame_latencies(base_url: str, n: int) -> dict[str, float]:
    image = jpeg()
    with httpx.Client(base_url=base_url, timeout=30) as http:
        session = http.post("/v1/streaming/sessions", json=SESSION).json()["session_id"]
        url = f"/v1/streaming/sessions/{session}/frame"
        headers = {"content-type": "image/jpeg"}
        for _ in range(10):  # warm-up
            http.post(url, content=image, headers=headers).raise_for_status()
        samples = []
        for _ in range(n):
            started = time.perf_counter()
            http.post(url, content=image, headers=headers).raise_for_status()
            samples.append((time.perf_counter() - started) * 1000)
        http.delete(f"/v1/streaming/sessions/{session}")
    return percentiles(samples)


def throughput(base_url: str, jobs: int, concurrency: int, steps: int) -> float:
    body = {"prompt": "a cube", "size": "64x64", "response_format": "url",
            "num_inference_steps": steps}

    def one(_: int) -> None:
        with httpx.Client(base_url=base_url, timeout=300) as http:
            http.post("/v1/images/generations", json=body).raise_for_status()

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(concurrency)))  # warm-up: every replica has run one
        started = time.perf_counter()
        list(pool.map(one, range(jobs)))
    return jobs / (time.perf_counter() - started)


def single_node(workdir: Path, n: int) -> dict[str, float]:
    config = {"stages": {"generation": {"enabled": False}, "realtime": {"enabled": False},
                         "reasoner": {"backend": "fake", "model_path": str(workdir)}}}
    (workdir / "single").mkdir()
    with harness.server(workdir / "single", config, timeout_s=120) as server:
        return frame_latencies(server.base_url, n)


def ray_path(workdir: Path, args: argparse.Namespace) -> dict[str, object]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    port = free_port()  # after Ray's own services took theirs
    config = ServerConfig.model_validate({"port": port, "stages": {
        "generation": {"model_path": str(workdir), "output_dir": str(workdir / "out")},
        "reasoner": {"backend": "fake", "model_path": str(workdir)},
        "realtime": {"enabled": False}}})
    base_url = f"http://127.0.0.1:{port}"
    one = ClusterOptions(replicas={"generation": 1}, engine_targets={"generation": SLEEP_ENGINE})
    two = ClusterOptions(replicas={"generation": 2}, engine_targets={"generation": SLEEP_ENGINE})
    try:
        deploy(config, None, one)
        latency = frame_latencies(base_url, args.n)
        rate_1 = throughput(base_url, args.jobs, args.concurrency, args.steps)
        serve.run(stage_application("generation", config, two),
                  name=stage_app_name("generation"), route_prefix=None)
        rate_2 = throughput(base_url, args.jobs, args.concurrency, args.steps)
    finally:
        shutdown()
        ray.shutdown()
    return {"latency": latency, "jobs_per_s_1": round(rate_1, 3), "jobs_per_s_2": round(rate_2, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--n", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        single = single_node(workdir, args.n)
        clustered = ray_path(workdir, args)
    ray_latency = clustered["latency"]
    result = {
        "jobs_per_s_1_replica": clustered["jobs_per_s_1"],
        "jobs_per_s_2_replicas": clustered["jobs_per_s_2"],
        "scale_out_ratio": round(clustered["jobs_per_s_2"] / clustered["jobs_per_s_1"], 2),
        "frame_single_node": single,
        "frame_ray": ray_latency,
        "added_p50_ms": round(ray_latency["p50_ms"] - single["p50_ms"], 2),
        "added_p99_ms": round(ray_latency["p99_ms"] - single["p99_ms"], 2),
    }
    harness.emit(result)


if __name__ == "__main__":
    main()
