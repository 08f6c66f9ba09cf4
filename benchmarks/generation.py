"""Generation serving cost and batching gain, on the dev checkpoint (or --model-path).

(a) server overhead: end-to-end latency of `POST /v1/images/generations` (b64_json) against the
    same diffusers pipeline called directly in this process with the same parameters
    (median of --n sequential requests each, after one warm-up call on both sides);
(b) batching: images/s with --concurrency clients against a server with max_batch_size 4 and
    against one with max_batch_size 1, both up at once, their rounds alternating (--repeats
    each; the median of each side is compared), the stage process's CPU seconds per image on
    each side (`batch_speedup_cpu`: the work batching saves, which a loaded shared machine
    hides from the wall clock), and the batched server's rows per denoising step (its
    `/admin/stats` telemetry: how full its batches really were).

    .venv/bin/python benchmarks/generation.py [--n 10] [--size 128x128] [--steps 8] [--repeats 3]
        [--threads 2]

Prints one JSON line at the end: {"server_overhead_ratio": ..., "batch_speedup_c4": ...,
"batch_speedup_cpu": ..., "rows_per_denoise_step_batch4": ...}.

`--model cosmos3` measures Cosmos3 instead (benchmarks/generation_cosmos3.py): server over
direct-pipeline latency and the interleaving ratio, e.g.

    .venv/bin/python benchmarks/generation.py --model cosmos3 --n 3 --size 64x64 --steps 8

With `--compile`, `--attention-backend X` and/or `--kv-reuse` (Cosmos3 only) it measures those
levers instead, each against the native / eager / no-reuse baseline in the same process
(benchmarks/generation_speed.py), e.g.

    .venv/bin/python benchmarks/generation.py --model cosmos3 --size 256x256 --steps 8 --n 3 \
        --compile --attention-backend _native_math --kv-reuse
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402
from tests.support.server import ServerProcess  # noqa: E402


def dev_generation_dir() -> Path:
    """The Wan dev checkpoint (dev-models' generation/ is Cosmos3 now)."""
    return harness.dev_model("wan")


def start(model: Path, workdir: Path, threads: int, **generation) -> ServerProcess:
    config = {"stages": {"reasoner": {"enabled": False},
                         "generation": {"model_path": str(model), **generation}}}
    return harness.start_server(workdir, config, threads=threads)


def body(args: argparse.Namespace, seed: int = 42) -> dict:
    return {"prompt": "a red car on a wooden table", "size": args.size, "seed": seed,
            "num_inference_steps": args.steps, "guidance_scale": args.guidance,
            "response_format": "b64_json"}


def paired_ms(server: ServerProcess, model: Path, args: argparse.Namespace) -> tuple[list, list]:
    """Direct pipeline call and server request, alternating, so load drift hits both alike."""
    import torch

    from worldserve.models.dev import checkpoint_defaults
    from worldserve.models.wan.family import DEFAULTS, DEV_DEFAULTS
    from worldserve.models.wan.loader import load_pipeline

    torch.set_num_threads(args.threads)  # the stage's torch threads too
    w, h = (int(v) for v in args.size.split("x"))
    pipe = load_pipeline(str(model), torch.float32, "cpu")
    # What the server fills in (negative prompt, text length): the Wan family's declaration.
    defaults = checkpoint_defaults(model, DEFAULTS, DEV_DEFAULTS)

    def direct() -> float:
        started = time.perf_counter()
        pipe("a red car on a wooden table", height=h, width=w, num_frames=1,
             num_inference_steps=args.steps, guidance_scale=args.guidance,
             negative_prompt=defaults.negative_prompt,
             max_sequence_length=defaults.max_sequence_length,
             generator=torch.Generator().manual_seed(42), output_type="np")
        return (time.perf_counter() - started) * 1000

    direct_out, server_out = [], []
    with httpx.Client(base_url=server.base_url, timeout=600) as client:
        def via_server() -> float:
            started = time.perf_counter()
            client.post("/v1/images/generations", json=body(args)).raise_for_status()
            return (time.perf_counter() - started) * 1000

        direct(), via_server()  # first calls pay one-time costs on both sides
        for _ in range(args.n):
            direct_out.append(direct())
            server_out.append(via_server())
    return direct_out, server_out


def throughput(server: ServerProcess, args: argparse.Namespace) -> float:
    total = args.concurrency * args.rounds

    def one(i: int) -> None:
        httpx.post(server.base_url + "/v1/images/generations", json=body(args, seed=i),
                   timeout=600).raise_for_status()

    one(0)
    started = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        list(pool.map(one, range(total)))
    return total / (time.perf_counter() - started)


def denoise_counters(server: ServerProcess) -> tuple[int, int]:
    """(denoising steps, rows they advanced) so far: the stage's batching telemetry ((0, 0)
    from a server without it, e.g. when measuring an older checkout)."""
    stats = httpx.get(server.base_url + "/admin/stats", timeout=30).json()
    extra = stats["stages"]["generation"]
    return extra.get("denoise_steps", 0), extra.get("denoise_rows", 0)


def stage_cpu_s(server: ServerProcess) -> float:
    """CPU seconds (user + system) the generation stage process has used so far (Linux)."""
    return harness.cpu_s(server.stage_pids()["generation"])


def batching(batched: ServerProcess, single: ServerProcess, args: argparse.Namespace) -> dict:
    """Images/s of both servers, rounds alternating (max_batch_size 4, then 1) so that the
    load of a shared machine hits both alike; the stage's CPU seconds per image (what the wall
    clock of a shared machine cannot show: the work batching saves); rows per denoising step
    of the batched one."""
    servers = {"batch4": batched, "batch1": single}
    rounds: dict[str, list[float]] = {"batch4": [], "batch1": []}
    cpu_s = {"batch4": 0.0, "batch1": 0.0}
    steps0, rows0 = denoise_counters(batched)
    for _ in range(args.repeats):
        for arm, server in servers.items():
            cpu0 = stage_cpu_s(server)
            rounds[arm].append(throughput(server, args))
            cpu_s[arm] += stage_cpu_s(server) - cpu0
    steps1, rows1 = denoise_counters(batched)
    ips4, ips1 = (statistics.median(rounds[k]) for k in ("batch4", "batch1"))
    images = args.repeats * (args.concurrency * args.rounds + 1)
    cpu4, cpu1 = (1000 * cpu_s[k] / images for k in ("batch4", "batch1"))
    return {
        "images_per_s_batch4_c4": round(ips4, 2), "images_per_s_batch1_c4": round(ips1, 2),
        "batch_speedup_c4": round(ips4 / ips1, 3),
        "batch_speedup_per_round": [round(a / b, 3) for a, b in zip(*rounds.values())],
        "stage_cpu_ms_per_image_batch4": round(cpu4, 1),
        "stage_cpu_ms_per_image_batch1": round(cpu1, 1),
        "batch_speedup_cpu": round(cpu1 / cpu4, 3),
        "rows_per_denoise_step_batch4": round((rows1 - rows0) / max(1, steps1 - steps0), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=("wan", "cosmos3"), default="wan")
    parser.add_argument("--model-path", type=Path)
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--size", default="128x128")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--guidance", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3,
                        help="throughput rounds per server, alternating between the two")
    parser.add_argument("--threads", type=int, default=2,
                        help="torch threads of the stages and of the in-process baseline")
    parser.add_argument("--compile", action="store_true",
                        help="cosmos3: compiled blocks (inductor) vs eager")
    parser.add_argument("--attention-backend", default=None,
                        help="cosmos3: this diffusers attention backend vs native")
    parser.add_argument("--kv-reuse", action="store_true",
                        help="cosmos3: understanding K/V reuse vs recomputation")
    parser.add_argument("--frames", type=int, default=1,
                        help="cosmos3 speed levers: frames per request (1: text-to-image)")
    parser.add_argument("--device", default="cpu", help="cosmos3 speed levers: the device")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                        help="cosmos3 speed levers: the weights' dtype")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-generation-"))
    if args.compile or args.attention_backend or args.kv_reuse:
        if args.model != "cosmos3":
            raise SystemExit("--compile / --attention-backend / --kv-reuse: use --model cosmos3")
        from benchmarks.generation_speed import run as run_speed

        harness.emit(run_speed(args, work))
        return
    if args.model == "cosmos3":
        from benchmarks.generation_cosmos3 import run

        harness.emit(run(args, work))
        return
    model = args.model_path or dev_generation_dir()
    batched = start(model, work, args.threads, max_batch_size=4)
    single = start(model, work, args.threads, max_batch_size=1)
    try:
        direct, via_server = paired_ms(batched, model, args)
        gain = batching(batched, single, args)
    finally:
        batched.stop()
        single.stop()
    result = {
        "size": args.size, "steps": args.steps, "n": args.n, "threads": args.threads,
        "direct_median_ms": round(statistics.median(direct), 2),
        "server_median_ms": round(statistics.median(via_server), 2),
        "server_overhead_ratio": round(
            statistics.median(via_server) / statistics.median(direct), 3),
        **gain,
    }
    harness.emit(result)


if __name__ == "__main__":
    main()
