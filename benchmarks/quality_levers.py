"""What each speed lever costs in meaning, on the trained dev world (issue 30 item 5).

For each lever, the same seeded grammar prompts run through the Cosmos3 runner of
`<dev-models>/world` (the serving path: prepare, every denoising step, decode) with the lever
and without it, in one process and one run. Reported per lever: the evaluator's accuracy
(images: colour and shape; videos: colour and direction), the PSNR of its frames against the
plain path's frames of the same seed, the transformer forwards skipped, and the CPU-time ratio
against the plain path. A lever that loses accuracy is not a default (docs/dev-world.md).

Levers measured: step caching (SeaCache at each threshold, TaylorSeer at each interval),
understanding K/V reuse, VAE tiling. Not here: FP8 (its CPU path is W8A16 emulation; the FP8
benchmark is benchmarks/fp8.py), compile, rank groups and colocation (processes; their
equivalence tests assert identical outputs), DFlash (a reasoner lever: benchmarks/dflash_world.py
measures the drafter trained against the world reasoner).

    .venv/bin/python benchmarks/quality_levers.py [--num-prompts 40] [--threads 1]

Prints a markdown table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.step_cache import one_run  # noqa: E402
from worldserve import envs  # noqa: E402
from worldserve.ipc.messages import GenerationParams  # noqa: E402
from worldserve.models.dev import WORLD_SAMPLING_DEFAULTS  # noqa: E402
from worldserve.models.dev.world import evaluate  # noqa: E402
from worldserve.models.dev.world.grammar import parse_prompt, sample_prompts  # noqa: E402
from worldserve.models.types import StepCacheSettings  # noqa: E402

DEFAULTS = WORLD_SAMPLING_DEFAULTS


def load(model: Path, lever: dict[str, Any]) -> Any:
    from worldserve.models import registry

    runner = registry.load_runner("generation", model)
    if "step_cache" in lever:
        runner.enable_step_cache(StepCacheSettings(**lever["step_cache"]))
    if lever.get("kv_reuse"):
        runner.configure_speed(understanding_kv_reuse=True)
    if "vae_tiling" in lever:
        runner.configure_vae(True, *lever["vae_tiling"])
    return runner


def levers(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {"plain": {},
                                      "seacache (default)": {"step_cache": {"method": "seacache"}}}
    for threshold in args.seacache_thresholds:
        out[f"seacache@{threshold:g}"] = {"step_cache": {"method": "seacache",
                                                         "threshold": threshold}}
    for interval in args.taylorseer_intervals:
        out[f"taylorseer/{interval}"] = {"step_cache": {"method": "taylorseer",
                                                        "interval": interval}}
    out["kv_reuse"] = {"kv_reuse": True}
    out["vae_tiling"] = {"vae_tiling": (32, 16)}
    return out


def run(runner: Any, prompt: str, frames: int, seed: int, cached: bool,
        steps: int) -> dict[str, Any]:
    """One request through the serving path (benchmarks/step_cache.py `one_run`)."""
    params = GenerationParams(
        prompt=prompt, width=DEFAULTS["width"], height=DEFAULTS["height"], num_frames=frames,
        num_inference_steps=steps, guidance_scale=DEFAULTS["guidance_scale"], seeds=[seed],
        fps=float(DEFAULTS["fps"]), step_cache=cached)
    return one_run(runner, params)


def psnr(ours: np.ndarray, reference: np.ndarray) -> float:
    mse = float(np.mean((ours.astype(np.float64) - reference.astype(np.float64)) ** 2))
    return 99.0 if mse == 0 else round(10 * np.log10(1.0 / mse), 2)


def score(frames: np.ndarray, prompt: str) -> dict[str, bool]:
    asked = parse_prompt(prompt)
    uint8 = (np.clip(frames, 0, 1) * 255).round().astype(np.uint8)
    if len(uint8) == 1:
        reading = evaluate.read_frame(uint8[0])
        return {"image_colour": reading.colour == asked.colour,
                "image_shape": reading.shape == asked.shape}
    clip = evaluate.read_clip(uint8)
    return {"video_colour": clip.colour == asked.colour,
            "video_direction": clip.direction == asked.direction}


def measure(model: Path, args: argparse.Namespace) -> dict[str, Any]:
    jobs = ([(p, 1) for p in sample_prompts(args.seed, args.num_prompts, "image")]
            + [(p, DEFAULTS["num_frames"]) for p in sample_prompts(args.seed, args.num_prompts)])
    plain: dict[int, np.ndarray] = {}
    results = {}
    for name, lever in levers(args).items():
        runner = load(model, lever)
        hits: dict[str, list[bool]] = {}
        psnrs, cpu, forwards, skipped = [], 0.0, 0, 0
        for index, (prompt, frames) in enumerate(jobs):
            result = run(runner, prompt, frames, args.seed + index, "step_cache" in lever,
                         args.steps)
            out = result["frames"]
            cpu += result["total_cpu_s"]
            forwards += result["forwards"] or 0
            skipped += result["skipped"]
            for key, hit in score(out, prompt).items():
                hits.setdefault(key, []).append(hit)
            if name == "plain":
                plain[index] = out
            else:
                psnrs.append(psnr(out, plain[index]))
        results[name] = {
            **{k: round(sum(v) / len(v), 3) for k, v in hits.items()},
            "psnr_db_vs_plain": round(float(np.median(psnrs)), 2) if psnrs else None,
            "forwards_skipped": f"{skipped}/{forwards}" if forwards else None,
            "cpu_s": round(cpu, 2)}
    base = results["plain"]["cpu_s"]
    for figures in results.values():
        figures["speedup_cpu"] = round(base / figures["cpu_s"], 3)
    return results


def table(results: dict[str, Any]) -> str:
    keys = ["image_colour", "image_shape", "video_colour", "video_direction",
            "psnr_db_vs_plain", "forwards_skipped", "speedup_cpu"]
    lines = ["| lever | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for name, figures in results.items():
        lines.append(f"| {name} | " + " | ".join(str(figures.get(k)) for k in keys) + " |")
    return "\n".join(lines)


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-prompts", type=int, default=40, help="of each kind")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULTS["num_inference_steps"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seacache-thresholds", type=float, nargs="*", default=[0.1, 0.2, 0.4])
    parser.add_argument("--taylorseer-intervals", type=int, nargs="*", default=[2, 3])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    root = envs.dev_models_dir()
    subprocess.run([sys.executable, "-m", "worldserve", "dev-models", "build", str(root)],
                   check=True)
    results = measure(root / "world", args)
    print(table(results))
    print(json.dumps({"num_prompts": args.num_prompts, "steps": args.steps,
                      "levers": results}))


if __name__ == "__main__":
    main()
