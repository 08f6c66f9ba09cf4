"""What the Generator NIM's `/v1/infer` costs over the native video job it translates into, and
what the cookbook's default text2video costs on the dev checkpoint.

Starts a server on the dev Cosmos3 directory and sends, alternately, the same small clip (80x48,
25 frames, 2 steps, seed 0) as:

- `infer`: `POST /nim/generator/v1/infer` (one synchronous call, base64 MP4 in JSON);
- `native`: `POST /v1/videos`, polling `GET /v1/videos/{id}` every 20 ms, then
  `GET /v1/videos/{id}/content`: what a `/v1/videos` client does for the same frames.

Then one cookbook-default `t2v.py` request (resolution 720_16_9 -> 80x48 on the dev checkpoint,
189 frames, 35 steps). Prints one JSON line: the medians, `infer_over_native` and the default
request's wall time. Timings on a shared CPU are noisy: the pairs interleave so the ratio holds.

    .venv/bin/python benchmarks/nim_infer.py [--n 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402
from tests.support.server import ServerProcess  # noqa: E402

NIM = {"model_mode": "text2video", "prompt": "a robot arm", "negative_prompt": "",
       "resolution": "720_16_9", "num_frames": 25, "fps": 24.0, "num_inference_steps": 2,
       "guidance_scale": 6.0, "flow_shift": 10.0, "seed": 0}
NATIVE = {"prompt": "a robot arm", "negative_prompt": "", "size": "80x48", "num_frames": 25,
          "fps": 24, "num_inference_steps": 2, "guidance_scale": 6.0, "flow_shift": 10.0,
          "seed": 0}
COOKBOOK_T2V = {**NIM, "num_frames": 189, "num_inference_steps": 35}


def start(workdir: Path) -> ServerProcess:
    config = {"stages": {"reasoner": {"enabled": False}, "realtime": {"enabled": False},
                         "generation": {
                             "model_path": str(harness.dev_model("generation", quiet=True))}}}
    return harness.start_server(workdir, config)


def timed_infer(http: httpx.Client, body: dict) -> float:
    start = time.perf_counter()
    response = http.post("/nim/generator/v1/infer", json=body)
    response.raise_for_status()
    assert response.json()["b64_video"]
    return time.perf_counter() - start


def timed_native(http: httpx.Client) -> float:
    start = time.perf_counter()
    job = http.post("/v1/videos", json=NATIVE).json()
    while job["status"] not in ("completed", "failed"):
        time.sleep(0.02)
        job = http.get(f"/v1/videos/{job['id']}").json()
    assert job["status"] == "completed" and http.get(job["url"]).content
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = start(Path(tmp))
        try:
            with httpx.Client(base_url=server.base_url, timeout=600) as http:
                timed_infer(http, NIM), timed_native(http)  # warm both paths
                infer, native = [], []
                for _ in range(args.n):
                    infer.append(timed_infer(http, NIM))
                    native.append(timed_native(http))
                cookbook = timed_infer(http, COOKBOOK_T2V)
        finally:
            server.stop()
    out = {"benchmark": "nim_infer", "n": args.n,
           "infer_p50_s": round(statistics.median(infer), 3),
           "native_p50_s": round(statistics.median(native), 3),
           "infer_over_native": round(statistics.median(infer) / statistics.median(native), 3),
           "cookbook_t2v_default_s": round(cookbook, 2),
           "cookbook_t2v_default": "720_16_9 (80x48 on the dev checkpoint), 189 frames, 35 steps"}
    harness.emit(out)


if __name__ == "__main__":
    main()
