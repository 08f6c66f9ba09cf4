"""Cost and benefit of `warmup_mode: server` against `off`, in paired launches.

Each pair starts one server per mode (order alternating) on the same checkpoint and measures:
time from launch to `/health` 200, latency of the first image request, and the generation
stage's RSS at readiness and after the first request. Reports the mean difference
(server - off) with a 95 % t interval over the pairs.

    .venv/bin/python benchmarks/warmup.py [--pairs 4] [--size 128x128] [--steps 8]

Prints one JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402
from benchmarks.generation import dev_generation_dir  # noqa: E402

# two-sided 95 % Student t quantiles by degrees of freedom
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262, 10: 2.228, 15: 2.131, 20: 2.086, 30: 2.042}


def launch(model: Path, mode: str, args: argparse.Namespace) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(prefix=f"bench-warmup-{mode}-"))
    config = {"stages": {"reasoner": {"enabled": False},
                         "generation": {"model_path": str(model), "warmup_mode": mode,
                                        "warmup_steps": args.steps}}}
    server, ready_s = harness.timed(harness.start_server, work, config, threads=2,
                                    timeout_s=600)
    try:
        pid = server.stage_pids()["generation"]
        rss_ready = harness.rss_mb(pid)
        t0 = time.perf_counter()
        httpx.post(server.base_url + "/v1/images/generations", timeout=600, json={
            "prompt": "a red car", "size": args.size, "num_inference_steps": args.steps,
            "response_format": "b64_json"}).raise_for_status()
        first_ms = (time.perf_counter() - t0) * 1000
        return {"ready_s": ready_s, "first_request_ms": first_ms, "rss_ready_mb": rss_ready,
                "rss_after_first_mb": harness.rss_mb(pid)}
    finally:
        server.stop()


def mean_ci(diffs: list[float]) -> list[float]:
    mean = statistics.fmean(diffs)
    if len(diffs) < 2:
        return [round(mean, 3), None, None]
    df = len(diffs) - 1
    t = T95.get(df) or T95[max(k for k in T95 if k <= df)]
    half = t * statistics.stdev(diffs) / len(diffs) ** 0.5
    return [round(mean, 3), round(mean - half, 3), round(mean + half, 3)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", type=Path)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--size", default="128x128")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    model = args.model_path or dev_generation_dir()
    runs: dict[str, list[dict[str, float]]] = {"server": [], "off": []}
    for i in range(args.pairs):
        order = ("server", "off") if i % 2 == 0 else ("off", "server")
        for mode in order:
            runs[mode].append(launch(model, mode, args))
            print(mode, json.dumps(runs[mode][-1]), file=sys.stderr)
    result: dict[str, object] = {"pairs": args.pairs, "size": args.size, "steps": args.steps}
    for key in ("ready_s", "first_request_ms", "rss_ready_mb", "rss_after_first_mb"):
        diffs = [s[key] - o[key] for s, o in zip(runs["server"], runs["off"])]
        result[f"{key}_server_minus_off"] = mean_ci(diffs)
        result[f"{key}_off_mean"] = round(statistics.fmean(o[key] for o in runs["off"]), 3)
    harness.emit(result)


if __name__ == "__main__":
    main()
