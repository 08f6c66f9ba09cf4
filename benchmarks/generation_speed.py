"""Cosmos3 speed levers, part of `benchmarks/generation.py --model cosmos3` when any of
`--compile`, `--attention-backend X`, `--kv-reuse` is given (same run, ratios printed).

Two runners on the same checkpoint in this process (the widened tiny Cosmos3 of
benchmarks/generation_cosmos3.py unless --model-path): the baseline (native attention, eager,
no K/V reuse) and one per lever with only that lever on (with both `--compile` and
`--kv-reuse`, the two together are a lever too: `compile_kv_reuse`). Each timed unit is one
request's `prepare` + every denoising step (the levers touch the transformer only; the VAE
decode is left out), baseline and levers alternating (--n rounds, medians). Compiled runners
are warmed first (their first forward, the compilation, is reported as `<lever>_compile_s`,
not timed). Also printed: the max |difference| of each lever's final latents from the
baseline's (K/V reuse alone: 0, bit-exact).

    .venv/bin/python benchmarks/generation.py --model cosmos3 --size 256x256 --steps 8 --n 3 \\
        --compile --attention-backend _native_math --kv-reuse

On a GPU (unverified here: no device was lent): `--device cuda --dtype bfloat16
--model-path <Cosmos3 directory> --attention-backend _flash_3` etc.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

PROMPT = "a robot arm picks up the blue cup on the wooden table next to the window"


def denoise(runner: Any, params: Any) -> tuple[float, Any]:
    """(ms, final latents) of one request's prepare + denoising steps (a device's queue
    drained before the clock stops)."""
    import torch

    started = time.perf_counter()
    state = runner.prepare(["bench"], [params], params.seeds)
    while not state.done_denoising:
        runner.denoise_step(state)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (time.perf_counter() - started) * 1000, state.rows[0].latents.float().cpu()


def levers(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """lever name -> configure_speed kwargs."""
    out: dict[str, dict[str, Any]] = {}
    if args.compile:
        out["compile"] = {"compile": True}
    if args.attention_backend:
        out[f"attention_{args.attention_backend}"] = {
            "attention_backend": args.attention_backend}
    if args.kv_reuse:
        out["kv_reuse"] = {"understanding_kv_reuse": True}
    if args.compile and args.kv_reuse:
        out["compile_kv_reuse"] = {"compile": True, "understanding_kv_reuse": True}
    return out


def run(args: argparse.Namespace, work: Path) -> dict:
    import torch

    from benchmarks.generation_cosmos3 import THREADS, build_wide
    from worldserve.ipc.messages import GenerationParams
    from worldserve.models import registry

    torch.set_num_threads(int(THREADS))
    model = args.model_path or build_wide(work / "cosmos3-wide")
    w, h = (int(v) for v in args.size.split("x"))
    params = GenerationParams(prompt=PROMPT, width=w, height=h, num_frames=args.frames,
                              num_inference_steps=args.steps, guidance_scale=6.0, seeds=[42],
                              fps=24.0)
    load = {"device": args.device, "dtype": args.dtype}
    baseline = registry.load_runner("generation", model, **load)
    runners: dict[str, Any] = {}
    result: dict[str, Any] = {"model": "cosmos3", "device": args.device, "dtype": args.dtype,
                              "frames": args.frames, "size": args.size,
                              "steps": args.steps, "n": args.n, "threads": int(THREADS)}
    for name, kwargs in levers(args).items():
        runner = registry.load_runner("generation", model, **load)
        runner.configure_speed(**kwargs)
        if kwargs.get("compile"):
            denoise(runner, params)  # the first forward compiles (the stage's warmup)
            result[f"{name}_compile_s"] = runner.describe()["speed"]["compile_s"]
        runners[name] = runner
    packed = baseline.prepare(["probe"], [params], params.seeds).rows[0].cond
    result["und_tokens"] = int(packed["und_len"])  # the understanding (text) stream
    result["gen_tokens"] = int(packed["sequence_length"]) - int(packed["und_len"])
    ms: dict[str, list[float]] = {"baseline": [], **{name: [] for name in runners}}
    reference = denoise(baseline, params)[1]  # warm-up of the baseline
    diffs = {name: (denoise(r, params)[1] - reference).abs().max().item()
             for name, r in runners.items()}
    for _ in range(args.n):
        ms["baseline"].append(denoise(baseline, params)[0])
        for name, runner in runners.items():
            ms[name].append(denoise(runner, params)[0])
    base = statistics.median(ms["baseline"])
    result["baseline_ms"] = round(base, 1)
    for name in runners:
        lever = statistics.median(ms[name])
        result[f"{name}_ms"] = round(lever, 1)
        result[f"{name}_speedup"] = round(base / lever, 3)
        result[f"{name}_max_abs_diff"] = diffs[name]
    return result
