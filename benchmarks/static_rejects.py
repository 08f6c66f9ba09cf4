"""How fast a bad request is refused while the generation stage is busy: the api's static rules
(`worldserve/ipc/rules.py`, read from the declared capabilities) beside a check only the stage
can make.

Starts a server on the dev Cosmos3 checkpoint, keeps its generation stage busy with video jobs,
and meanwhile sends, alternately, two kinds of invalid `POST /v1/videos`:

- `api`: `num_frames` 6 (not 4k+1): a static rule, answered by the api before relaying;
- `stage`: an unknown LoRA adapter name: only the stage knows what is loaded, so the request
  crosses to the stage, waits for its loop to take it between steps, and comes back.

Before issue 24's item 4 the static rules ran where the `stage` case still runs, so its latency is
what a static 400 cost then (1.7-7.4 s reported under load). Prints one JSON line:
the p50/p90 of each and `stage_over_api_p50`.

    .venv/bin/python benchmarks/static_rejects.py [--busy-jobs 3] [--steps 24] [--n 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402
from tests.support.server import ServerProcess  # noqa: E402

VIDEO = {"prompt": "a robot arm", "size": "48x32", "num_frames": 9}
BAD = {"api": {**VIDEO, "num_frames": 6, "num_inference_steps": 1},
       "stage": {**VIDEO, "num_inference_steps": 1, "lora": "no-such-adapter"}}


def start(workdir: Path) -> ServerProcess:
    config = {"stages": {"reasoner": {"enabled": False}, "generation": {
        "model_path": str(harness.dev_model("generation", quiet=True))}}}
    return harness.start_server(workdir, config)


def keep_busy(base_url: str, args: argparse.Namespace, stop: threading.Event) -> None:
    """Video jobs, `busy_jobs` at a time, until `stop` (its own client: its own thread)."""
    live: list[str] = []
    seed = 0
    with httpx.Client(base_url=base_url, timeout=120) as http:
        while not stop.is_set():
            while len(live) < args.busy_jobs:
                job = http.post("/v1/videos", json={**VIDEO, "num_inference_steps": args.steps,
                                                    "seed": seed}).json()
                live.append(job["id"])
                seed += 1
            live = [i for i in live if http.get(f"/v1/videos/{i}").json()["status"]
                    in ("queued", "in_progress")]
            time.sleep(0.05)


def refusal_ms(http: httpx.Client, kind: str) -> float:
    began = time.perf_counter()
    response = http.post("/v1/videos", json=BAD[kind])
    elapsed = (time.perf_counter() - began) * 1000
    if response.status_code != 400:
        raise RuntimeError(f"{kind}: expected 400, got {response.status_code} {response.text}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy-jobs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--n", type=int, default=15, help="refusals of each kind")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = start(Path(tmp))
        try:
            with httpx.Client(base_url=server.base_url, timeout=120) as http:
                for kind in BAD:  # warm both paths
                    refusal_ms(http, kind)
                stop = threading.Event()
                busy = threading.Thread(target=keep_busy, args=(server.base_url, args, stop),
                                        daemon=True)
                busy.start()
                time.sleep(2.0)  # the stage is now stepping jobs
                samples: dict[str, list[float]] = {kind: [] for kind in BAD}
                for _ in range(args.n):
                    for kind in BAD:  # interleaved: both see the same load
                        samples[kind].append(refusal_ms(http, kind))
                stop.set()
                busy.join(timeout=60)
        finally:
            server.stop()
    report = {kind: {"p50_ms": round(statistics.median(v), 1),
                     "p90_ms": round(harness.percentile(v, 0.9), 1)} for kind, v in samples.items()}
    ratio = report["stage"]["p50_ms"] / max(report["api"]["p50_ms"], 1e-6)
    harness.emit({"benchmark": "static_rejects", "busy_jobs": args.busy_jobs,
                  "steps": args.steps, "n": args.n, **report,
                  "stage_over_api_p50": round(ratio, 1)})


if __name__ == "__main__":
    main()
