"""Step caching on a Cosmos3 dev video: each cache method against no cache, in one run.

For every method (none, seacache, taylorseer) and each guidance scale (--guidance, default
6 and 1), one 30-step video through the stepped runner (the serving path: per-row cache
contexts), timed over --repeats runs (median, methods interleaved per repeat so machine load
hits all alike). Reported per method: the denoising speed ratio against no cache (and the
whole request's, with prompt encoding and the VAE decode), the transformer forwards skipped, and
the PSNR of the decoded frames against the uncached frames of the same seed. Ratios are given
on the main thread's CPU seconds (with --threads 1, torch computes on that thread: the most
stable figure on a shared, loaded machine) and on wall seconds; `ideal` is forwards / forwards
run, what the ratio would be if a skipped forward cost nothing and a run one no more than
without the cache.

Random weights make PSNR a weak signal: a random transformer's velocity is not smooth along
the trajectory, so a reused residual is off by more than a trained model's would be. With
guidance_scale 1 there is one forward per step and no CFG amplification of the error, which
is the smoother case. FBCache, MagCache and TeaCache do not run on Cosmos3 in diffusers 0.42.1
(levers/step_cache.py says why) and are listed as such.

    .venv/bin/python benchmarks/step_cache.py [--model wide|dev] [--steps 30] [--size 64x64]
        [--frames 9] [--repeats 3] [--threads 1] [--seacache-thresholds 0.1 ...]

Prints a table, then one JSON line: {"step_cache": {method: {guidance: {...}}}, ...}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402
from benchmarks.generation_cosmos3 import WIDE  # noqa: E402
from worldserve.config import UNSUPPORTED_STEP_CACHES  # noqa: E402
from worldserve.engines.generation.contract import StepCacheRunner  # noqa: E402
from worldserve.ipc.messages import GenerationParams  # noqa: E402
from worldserve.levers.step_cache import METHODS  # noqa: E402
from worldserve.models.types import StepCacheSettings  # noqa: E402

PROMPT = "a robot arm picks up the blue cup and puts it on the shelf"


def build(kind: str, target: Path) -> Path:
    from worldserve.models.cosmos3.dev import Cosmos3DevConfig, build_cosmos3

    build_cosmos3(target, 0, Cosmos3DevConfig(**WIDE) if kind == "wide" else Cosmos3DevConfig())
    (target / "worldserve_dev.json").write_text(json.dumps({"name": f"bench-{kind}"}))
    return target


def load(model: Path, method: str | None, threshold: float | None) -> object:
    from worldserve.models import registry

    runner = registry.load_runner("generation", model)
    if method is not None:
        runner.enable_step_cache(StepCacheSettings(method=method, threshold=threshold))
    return runner


def one_run(runner, params: GenerationParams) -> dict:
    """Prepare, every step, decode of one row; the seconds of each part and the frames."""
    started, started_cpu = time.perf_counter(), time.thread_time()
    state = runner.prepare(["bench"], [params], params.seeds)
    prepared, prepared_cpu = time.perf_counter(), time.thread_time()
    while not state.done_denoising:
        runner.denoise_step(state)
    denoised, denoised_cpu = time.perf_counter(), time.thread_time()
    frames = runner.decode(state, 0)
    done, done_cpu = time.perf_counter(), time.thread_time()
    # optional in the runner contract (a rank group's runner has none), as the engine asks
    stats = runner.step_cache_stats(state, 0) if isinstance(runner, StepCacheRunner) else None
    return {"denoise_s": denoised - prepared, "total_s": done - started,
            "denoise_cpu_s": denoised_cpu - prepared_cpu, "total_cpu_s": done_cpu - started_cpu,
            "frames": frames,
            "forwards": stats.num_forwards if stats else None,
            "skipped": stats.num_forwards_skipped if stats else 0}


def psnr(ours: np.ndarray, reference: np.ndarray) -> float:
    mse = float(np.mean((ours.astype(np.float64) - reference.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(1.0 / mse)


def measure(model: Path, args: argparse.Namespace) -> dict:
    width, height = (int(v) for v in args.size.lower().split("x"))
    variants = [("none", None, None)] + [(m, m, None) for m in METHODS]
    variants += [(f"seacache@{t:g}", "seacache", t) for t in args.seacache_thresholds]
    runners = {name: load(model, method, threshold) for name, method, threshold in variants}
    results: dict = {}
    for guidance in args.guidance:
        params = {name: GenerationParams(
            prompt=PROMPT, width=width, height=height, num_frames=args.frames,
            num_inference_steps=args.steps, guidance_scale=guidance, seeds=[7], fps=24.0,
            step_cache=name != "none") for name in runners}
        runs: dict[str, list[dict]] = {name: [] for name in runners}
        for name in runners:  # warm-up (allocator, kernels)
            one_run(runners[name], params[name])
        for _ in range(args.repeats):
            for name, runner in runners.items():
                runs[name].append(one_run(runner, params[name]))
        base = runs["none"]

        def median(items: list[dict], key: str) -> float:
            return statistics.median(r[key] for r in items)

        for name, items in runs.items():
            forwards = items[0]["forwards"] or args.steps * (2 if guidance != 1 else 1)
            figures = {key: round(median(items, key), 3) for key in
                       ("denoise_s", "total_s", "denoise_cpu_s", "total_cpu_s")}
            results.setdefault(name, {})[f"guidance_{guidance:g}"] = {
                **figures,
                "denoise_speedup": round(median(base, "denoise_s") / figures["denoise_s"], 3),
                "total_speedup": round(median(base, "total_s") / figures["total_s"], 3),
                "denoise_speedup_cpu": round(median(base, "denoise_cpu_s")
                                             / figures["denoise_cpu_s"], 3),
                "total_speedup_cpu": round(median(base, "total_cpu_s")
                                           / figures["total_cpu_s"], 3),
                "forwards": forwards,
                "forwards_skipped": items[0]["skipped"],
                "ideal_speedup": round(forwards / max(1, forwards - items[0]["skipped"]), 3),
                "psnr_db": round(psnr(items[0]["frames"], base[0]["frames"]), 2)}
    return results


def table(results: dict) -> str:
    lines = ["| method | guidance | denoise CPU s | denoise speedup (CPU s) | request speedup "
             "(CPU s) | denoise speedup (wall) | forwards skipped | ideal | PSNR vs uncached "
             "(dB) |", "|---|---|---|---|---|---|---|---|---|"]
    for name, by_guidance in results.items():
        for guidance, r in by_guidance.items():
            lines.append(f"| {name} | {guidance.removeprefix('guidance_')} | "
                         f"{r['denoise_cpu_s']} | {r['denoise_speedup_cpu']}x | "
                         f"{r['total_speedup_cpu']}x | {r['denoise_speedup']}x | "
                         f"{r['forwards_skipped']}/{r['forwards']} | {r['ideal_speedup']}x | "
                         f"{r['psnr_db']} |")
    for name, why in UNSUPPORTED_STEP_CACHES.items():
        lines.append(f"| {name} | - | not run on Cosmos3: {why} | | | | | | |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("wide", "dev"), default="wide",
                        help="wide: the dev Cosmos3 widened to hidden 256 x 4 layers (the "
                             "transformer dominates, as at full size); dev: the tiny default")
    parser.add_argument("--model-path", type=Path, default=None)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--size", default="64x64")
    parser.add_argument("--frames", type=int, default=9)
    parser.add_argument("--guidance", type=float, nargs="+", default=[6.0, 1.0])
    parser.add_argument("--seacache-thresholds", type=float, nargs="*", default=[],
                        help="extra SeaCache thresholds to run besides the default")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads; with 1 the CPU-second figures are this thread's "
                             "own, which other processes' load does not inflate")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model_path or build(args.model, Path(tmp) / args.model)
        results = measure(model, args)
    print(table(results))
    harness.emit({"step_cache": results, "model": args.model, "steps": args.steps,
                  "size": args.size, "frames": args.frames, "repeats": args.repeats})


if __name__ == "__main__":
    main()
