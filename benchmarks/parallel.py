"""One request across several ranks (stages.generation.parallel, docs/parallel.md): seconds per
denoising step of a rank group against one process, measured in the same run.

CPU (default; what ran here): a widened dev Cosmos3 whose step (cond + uncond forward) takes
>= 2 s on one torch thread; three contestants live side by side, each in its own process
tree, one thread per rank: one process, `cfg=2` and `ulysses=2` (the real rank-group runtime:
peers spawned by rank 0, gloo). Their steps are interleaved (A, B, C, A, B, C, ...) so that
machine noise hits all three alike; the decoded videos are compared at the end.

    .venv/bin/python benchmarks/parallel.py [--steps 6]

GPU (prepared, not run yet: no multi-GPU machine here): a full-size random-weight
Nano-shaped generator (hidden 4096, 36 layers, 32/8 heads) in bf16 at 720p on 1/2/4/8 GPUs
(layouts: 1 = one process, 2 = cfg=2, 4 = cfg=2,ulysses=2, 8 = cfg=2,ulysses=4), NCCL.
`--dry-run` runs that same code path on CPU with gloo and a tiny Nano-shaped model.

    .venv/bin/python benchmarks/parallel.py --gpu [--gpus 1,2,4,8] [--frames 93] [--steps 2]
    .venv/bin/python benchmarks/parallel.py --gpu --dry-run

Each prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402

PROMPT = "a robot arm picks up the blue cup"
# Widened from the dev config (hidden 32 x 2 layers) until one step takes >= 2 s here.
WIDE = dict(hidden_size=768, head_dim=64, num_attention_heads=12, num_key_value_heads=4,
            intermediate_size=2304, num_hidden_layers=8, rope_axes_dim=(16, 8, 8))
CPU_REQUEST = dict(prompt=PROMPT, width=320, height=320, num_frames=33, num_inference_steps=50,
                   guidance_scale=6.0, seeds=[7], fps=24.0)
CPU_CONTESTANTS = {"one_process": "", "cfg2": "cfg=2", "ulysses2": "ulysses=2"}
GPU_LAYOUTS = {1: "", 2: "cfg=2", 4: "cfg=2,ulysses=2", 8: "cfg=2,ulysses=4"}


# ---------------------------------------------------------------------- CPU: contestants


def _contestant(conn: Any, model_dir: str, parallel: str) -> None:
    """A child process holding one runner (one process or rank 0 of a group) that runs the
    phases the parent asks for and answers their wall times."""
    os.environ["WORLDSERVE_TORCH_THREADS"] = "1"
    import torch

    from worldserve.config import GenerationStageConfig
    from worldserve.ipc.messages import GenerationParams
    from worldserve.models import registry
    from worldserve.ranks.runner import start_rank_runner

    torch.set_num_threads(1)
    path = Path(model_dir)
    if parallel:
        config = GenerationStageConfig(model_path=path, parallel=parallel, start_timeout_s=900)
        runner = start_rank_runner(config, path)
    else:
        runner = registry.load_runner("generation", path)
    conn.send("ready")
    pids = [os.getpid(), *(runner.group.pids().values() if parallel else [])]
    state = None
    while True:
        verb, arg = conn.recv()
        start, cpu = time.perf_counter(), [harness.cpu_s(pid) for pid in pids]
        if verb == "prepare":
            params = GenerationParams(**arg)
            state = runner.prepare(["bench"], [params], params.seeds)
        elif verb == "step":
            runner.denoise_step(state)
        elif verb == "decode":
            conn.send(runner.decode(state, 0))
            continue
        else:
            break
        busiest = max(harness.cpu_s(pid) - before for pid, before in zip(pids, cpu))
        conn.send((time.perf_counter() - start, busiest))
    if parallel:
        runner.group.close()


def _spin(queue: Any = None) -> float:
    """Wall seconds of a fixed pure-Python loop (one core's worth of work)."""
    start = time.perf_counter()
    total = 0
    for i in range(5_000_000):
        total += i
    elapsed = time.perf_counter() - start
    if queue is not None:
        queue.put(elapsed)
    return elapsed


def machine_capacity() -> float:
    """How many cores this machine gives two busy processes right now: 2 x (the loop alone) /
    (the same loop in two processes at once, mean). 2.0: two free cores; 1.0: other work
    leaves one core's worth, and no group of two ranks can beat one process on the wall."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    alone = _spin()
    queue = ctx.Queue()
    procs = [ctx.Process(target=_spin, args=(queue,)) for _ in range(2)]
    for proc in procs:
        proc.start()
    pair = [queue.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join()
    return round(2 * alone / statistics.mean(pair), 2)


def build_wide(target: Path) -> Path:
    from worldserve.models.cosmos3.dev import Cosmos3DevConfig, build_cosmos3

    target.mkdir(parents=True, exist_ok=True)
    build_cosmos3(target, 0, Cosmos3DevConfig(**WIDE))  # type: ignore[arg-type]
    return target


def cpu_bench(args: argparse.Namespace) -> dict[str, Any]:
    import multiprocessing as mp

    import numpy as np

    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="bench-parallel-") as tmp:
        model = build_wide(Path(tmp) / "cosmos3")
        pipes, procs = {}, []
        for name, parallel in CPU_CONTESTANTS.items():
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_contestant, args=(child, str(model), parallel))
            proc.start()
            pipes[name], procs = parent, procs + [proc]
        for conn in pipes.values():
            assert conn.recv() == "ready"
        load_before, capacity_before = os.getloadavg(), machine_capacity()
        times: dict[str, list[float]] = {name: [] for name in pipes}
        cpu: dict[str, list[float]] = {name: [] for name in pipes}
        request = dict(CPU_REQUEST, num_inference_steps=args.steps + 1)
        for name, conn in pipes.items():
            conn.send(("prepare", request))
            conn.recv()
            conn.send(("step", None))  # warm-up step, not counted
            conn.recv()
        for _ in range(args.steps):
            for name, conn in pipes.items():  # interleaved: noise hits all alike
                conn.send(("step", None))
                wall_s, busiest_cpu_s = conn.recv()
                times[name].append(wall_s)
                cpu[name].append(busiest_cpu_s)
        frames = {}
        for name, conn in pipes.items():
            conn.send(("decode", None))
            frames[name] = conn.recv()
            conn.send(("stop", None))
        for proc in procs:
            proc.join(timeout=60)
    base = statistics.median(times["one_process"])
    base_cpu = statistics.median(cpu["one_process"])
    return {
        "benchmark": "parallel", "mode": "cpu", "threads_per_rank": 1,
        "model": WIDE, "request": {k: CPU_REQUEST[k] for k in ("width", "height", "num_frames")},
        "steps_timed": args.steps,
        "step_s": {name: round(statistics.median(t), 3) for name, t in times.items()},
        "step_s_range": {name: [round(min(t), 3), round(max(t), 3)] for name, t in times.items()},
        "speedup": {name: round(base / statistics.median(t), 3)
                    for name, t in times.items() if name != "one_process"},
        # CPU seconds of the busiest rank per step, and the speedup they allow with one free
        # core per rank: what the wall-clock ratio approaches on an unloaded machine.
        "busiest_rank_cpu_s": {name: round(statistics.median(c), 3) for name, c in cpu.items()},
        "cpu_critical_path_speedup": {name: round(base_cpu / statistics.median(c), 3)
                                      for name, c in cpu.items() if name != "one_process"},
        "max_abs_frame_diff": {name: float(np.abs(f - frames["one_process"]).max())
                               for name, f in frames.items() if name != "one_process"},
        "load_avg_1m": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "machine_parallel_capacity": [capacity_before, machine_capacity()],
    }


# ---------------------------------------------------------------------- GPU


def nano_shape(dry_run: bool) -> dict[str, Any]:
    """The Nano transformer's shape (class defaults), or a tiny one with the same proportions."""
    if not dry_run:
        return {}
    return dict(hidden_size=64, head_dim=16, num_attention_heads=8, num_key_value_heads=4,
                intermediate_size=192, num_hidden_layers=2, rope_axes_dim=[4, 2, 2],
                vocab_size=1024)


def _random_pipeline(device: str, dtype: Any, dry_run: bool) -> Any:
    """A Nano-shaped random-weight pipeline built on `device` (same seed on every rank, so
    every rank holds the same weights); the Wan2.2 VAE at its real size (tiny in a dry run)."""
    import torch
    from diffusers import (
        AutoencoderKLWan,
        Cosmos3OmniPipeline,
        Cosmos3OmniTransformer,
        UniPCMultistepScheduler,
    )

    from worldserve.models.dev.tokenizer import build_tokenizer

    torch.manual_seed(0)
    vae_base = 8 if dry_run else 160
    with torch.device(device):
        torch.set_default_dtype(dtype)  # built in bf16 directly: no fp32 copy of 15 B weights
        try:
            transformer = Cosmos3OmniTransformer(**nano_shape(dry_run)).eval()
            vae = AutoencoderKLWan(
                base_dim=vae_base, decoder_base_dim=vae_base if dry_run else 256, z_dim=48,
                dim_mult=[1, 2, 4, 4], num_res_blocks=2, is_residual=True, in_channels=12,
                out_channels=12, patch_size=2, scale_factor_spatial=16,
                scale_factor_temporal=4, latents_mean=[0.0] * 48,
                latents_std=[1.0] * 48).eval()
        finally:
            torch.set_default_dtype(torch.float32)
    transformer.time_embedder.to(torch.float32)  # as from_pretrained keeps it
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                        flow_shift=5.0)
    return Cosmos3OmniPipeline(transformer=transformer, vae=vae, scheduler=scheduler,
                               text_tokenizer=build_tokenizer(512), sound_tokenizer=None,
                               safety_checker=None, enable_safety_checker=False)


def _gpu_rank(rank: int, world: int, port: int, args: Any, queue: Any) -> None:
    """One rank of an N-GPU group: the real ParallelCosmos3Runner over NCCL (gloo in a dry
    run), timing steps and the decode; rank 0 reports."""
    import datetime

    import torch
    import torch.distributed as dist

    from worldserve.config import GenerationParallelConfig
    from worldserve.ipc.messages import GenerationParams
    from worldserve.levers.parallel.mesh import ParallelLayout, RankMesh
    from worldserve.models.cosmos3.parallel import ParallelCosmos3Runner

    device = "cpu" if args.dry_run else f"cuda:{rank}"
    if not args.dry_run:
        torch.cuda.set_device(rank)
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    parallel = GenerationParallelConfig.model_validate(GPU_LAYOUTS[world])
    layout = ParallelLayout(cfg=parallel.cfg, ulysses=parallel.ulysses, ring=parallel.ring,
                            shard=parallel.shard)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0)
    dist.init_process_group("gloo" if args.dry_run else "nccl", store=store, rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=600))
    runner = ParallelCosmos3Runner(_random_pipeline(device, dtype, args.dry_run), None,
                                   RankMesh(layout, rank))
    runner.connect_ranks(600)
    height, width = (64, 96) if args.dry_run else (720, 1280)
    params = GenerationParams(prompt=PROMPT, width=width, height=height,
                              num_frames=args.frames, num_inference_steps=args.steps + 1,
                              guidance_scale=6.0, seeds=[7], fps=24.0)
    state = runner.prepare(["bench"], [params], params.seeds)
    times = [_timed(lambda: runner.denoise_step(state), device) for _ in range(args.steps + 1)]
    decode_s = _timed(lambda: runner.decode(state, 0), device) if args.decode else None
    if rank == 0:
        queue.put({"gpus": world, "layout": GPU_LAYOUTS[world] or "one process",
                   "step_s": round(statistics.median(times[1:]), 3),
                   "decode_s": round(decode_s, 3) if decode_s is not None else None,
                   "peak_gib": (round(torch.cuda.max_memory_allocated() / 2**30, 1)
                                if not args.dry_run else None)})
    dist.destroy_process_group()


def _timed(fn: Any, device: str) -> float:
    import torch

    start = time.perf_counter()
    fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def gpu_check_parallel(gpus: tuple[int, ...] = (1, 2, 4, 8), steps: int = 2,
                       frames: int = 93, dry_run: bool = False,
                       decode: bool = False) -> dict[str, Any]:
    """The GPU mode as a function (for benchmarks/gpu_check.py): world sizes the machine cannot
    hold are skipped and listed."""
    import socket

    import torch
    import torch.multiprocessing as mp

    available = 4 if dry_run else torch.cuda.device_count()
    args = argparse.Namespace(steps=steps, frames=frames, dry_run=dry_run, decode=decode)
    runs, skipped = [], []
    for world in gpus:
        if world > available or world not in GPU_LAYOUTS:
            skipped.append(world)
            continue
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        queue = mp.get_context("spawn").Queue()
        mp.start_processes(_gpu_rank, args=(world, port, args, queue), nprocs=world,
                           start_method="spawn")
        runs.append(queue.get(timeout=60))
    base = next((r["step_s"] for r in runs if r["gpus"] == 1), None)
    for run in runs:
        run["speedup"] = round(base / run["step_s"], 3) if base else None
    return {"benchmark": "parallel", "mode": "gpu-dry-run" if dry_run else "gpu",
            "frames": frames, "size": "96x64" if dry_run else "1280x720", "runs": runs,
            "skipped_gpus": skipped}


def part_parallel(setup: Any, tmp: Path) -> dict[str, Any]:
    """`benchmarks/gpu_check.py`'s part signature (`PARTS["parallel"] = part_parallel`): the
    GPU mode on the GPUs the machine has (one GPU: the one-process baseline only)."""
    dry_run = bool(setup.dry_run)
    return gpu_check_parallel(gpus=(1, 2) if dry_run else (1, 2, 4, 8), steps=2,
                              frames=5 if dry_run else 93, dry_run=dry_run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=None, help="timed steps (after 1 warm-up)")
    parser.add_argument("--gpu", action="store_true", help="the multi-GPU mode")
    parser.add_argument("--gpus", default="1,2,4,8")
    parser.add_argument("--frames", type=int, default=None)
    parser.add_argument("--decode", action="store_true", help="GPU mode: also time the decode")
    parser.add_argument("--dry-run", action="store_true",
                        help="GPU mode's code path on CPU (gloo, tiny model)")
    args = parser.parse_args()
    if not args.gpu:
        args.steps = args.steps or 6
        harness.emit(cpu_bench(args))
        return
    gpus = tuple(int(g) for g in args.gpus.split(","))
    frames = args.frames or (5 if args.dry_run else 93)
    print(json.dumps(gpu_check_parallel(gpus, args.steps or 2, frames, args.dry_run,
                                        args.decode)))


if __name__ == "__main__":
    main()
