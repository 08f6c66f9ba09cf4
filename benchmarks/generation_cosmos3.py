"""Cosmos3 part of `benchmarks/generation.py --model cosmos3` (same run, ratios printed).

(a) server / direct: `POST /v1/images/generations` against `Cosmos3OmniPipeline.__call__` in
    this process with the same parameters, alternating (median of --n each, after one warm-up
    call on both sides), on a widened tiny Cosmos3 whose direct call takes >= 1 s here;
(b) interleaving: latency of a 2-step image request submitted while a 40-step video job runs,
    over the same image request alone (the stage interleaves steps round-robin).

Both sides use one torch thread: on a loaded 2-core machine more threads oversubscribe.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import httpx

from benchmarks import harness
from tests.support.server import ServerProcess

THREADS = "1"
PROMPT = "a robot arm picks up the blue cup"
# Widened from the dev config (hidden 32 x 2 layers) until one direct call takes >= 1 s.
WIDE = dict(hidden_size=256, head_dim=32, num_attention_heads=8, num_key_value_heads=2,
            intermediate_size=768, num_hidden_layers=4, rope_axes_dim=(8, 4, 4))
SMALL_DEFAULTS = {"width": 64, "height": 64, "num_frames": 5, "num_inference_steps": 8,
                  "guidance_scale": 6.0, "image_width": 64, "image_height": 64}


def build_wide(target: Path) -> Path:
    from worldserve.models.cosmos3.dev import Cosmos3DevConfig, build_cosmos3

    target.mkdir(parents=True, exist_ok=True)
    build_cosmos3(target, 0, Cosmos3DevConfig(**WIDE))
    # Small sampling defaults keep the background warmup step short.
    marker = {"name": "bench-cosmos3", "sampling_defaults": SMALL_DEFAULTS}
    (target / "worldserve_dev.json").write_text(json.dumps(marker))
    return target


def start(model: Path, workdir: Path) -> ServerProcess:
    config = {"stages": {"reasoner": {"enabled": False}, "realtime": {"enabled": False},
                         "generation": {"model_path": str(model), "max_running_requests": 2}}}
    return harness.start_server(workdir, config, threads=THREADS)


def image_body(size: str, steps: int, seed: int = 42) -> dict:
    return {"prompt": PROMPT, "size": size, "seed": seed, "num_inference_steps": steps,
            "guidance_scale": 6.0, "response_format": "b64_json"}


def paired_ms(server: ServerProcess, model: Path, args: argparse.Namespace) -> tuple[list, list]:
    import torch
    from diffusers import Cosmos3OmniPipeline

    torch.set_num_threads(int(THREADS))
    w, h = (int(v) for v in args.size.split("x"))
    pipe = Cosmos3OmniPipeline.from_pretrained(model, enable_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)

    def direct() -> float:
        started = time.perf_counter()
        pipe(prompt=PROMPT, num_frames=1, height=h, width=w, num_inference_steps=args.steps,
             guidance_scale=6.0, generator=torch.Generator("cpu").manual_seed(42),
             output_type="np")
        return (time.perf_counter() - started) * 1000

    direct_out, server_out = [], []
    with httpx.Client(base_url=server.base_url, timeout=600) as client:
        def via_server() -> float:
            started = time.perf_counter()
            client.post("/v1/images/generations",
                        json=image_body(args.size, args.steps)).raise_for_status()
            return (time.perf_counter() - started) * 1000

        direct(), via_server()
        for _ in range(args.n):
            direct_out.append(direct())
            server_out.append(via_server())
    return direct_out, server_out


def interleave_ms(server: ServerProcess, args: argparse.Namespace) -> tuple[float, float]:
    """(2-step image alone, the same image while a 40-step video runs), medians in ms."""
    with httpx.Client(base_url=server.base_url, timeout=600) as client:
        def image() -> float:
            started = time.perf_counter()
            client.post("/v1/images/generations",
                        json=image_body(args.size, 2)).raise_for_status()
            return (time.perf_counter() - started) * 1000

        alone = [image() for _ in range(args.n)]
        busy = []
        for _ in range(args.n):
            job = client.post("/v1/videos", json={"prompt": PROMPT, "size": args.size,
                                                  "num_frames": 9, "num_inference_steps": 40,
                                                  "guidance_scale": 6.0}).json()
            while client.get(f"/v1/videos/{job['id']}").json()["progress"] < 5:
                time.sleep(0.05)  # the video is denoising
            busy.append(image())
            if client.get(f"/v1/videos/{job['id']}").json()["status"] != "in_progress":
                raise SystemExit("the video finished before the image: raise its steps")
            client.delete(f"/v1/videos/{job['id']}")
    return statistics.median(alone), statistics.median(busy)


def run(args: argparse.Namespace, work: Path) -> dict:
    model = args.model_path or build_wide(work / "cosmos3-wide")
    server = start(model, work)
    try:
        direct, via_server = paired_ms(server, model, args)
        alone, busy = interleave_ms(server, args)
    finally:
        server.stop()
    return {
        "model": "cosmos3", "size": args.size, "steps": args.steps, "n": args.n,
        "direct_median_ms": round(statistics.median(direct), 2),
        "server_median_ms": round(statistics.median(via_server), 2),
        "server_over_direct": round(statistics.median(via_server) / statistics.median(direct),
                                    3),
        "image_2step_alone_ms": round(alone, 2),
        "image_2step_during_40step_video_ms": round(busy, 2),
        "interleave_ratio": round(busy / alone, 3),
    }
