"""What each speed lever costs in meaning, on the trained dev world (issue 30 item 5).

For each lever, the same seeded grammar prompts run through the Cosmos3 runner of
`<dev-models>/world` (the serving path: prepare, every denoising step, decode) with the lever
and without it, in one process and one run. Reported per lever: the evaluator's accuracy
(images: colour and shape; videos: colour and direction), the PSNR of its frames against the
plain path's frames of the same seed, the transformer forwards skipped, and the CPU-time ratio
against the plain path (after one warm-up request of each shape, not counted). A lever that
loses accuracy is not a default (docs/dev-world.md).

Levers measured: step caching (SeaCache at each threshold, TaylorSeer at each interval),
understanding K/V reuse, VAE tiling, FP8 W8A16 (the generator's linears quantised to FP8 E4M3
in ModelOpt's exported layout, dequantised to the compute dtype at load: what a CPU or a
pre-sm89 GPU runs), compile (inductor blocks), rank groups `cfg=2` and `ulysses=2` (the real
group: peers spawned, gloo) and colocation (the reasoner tied to the generator's weights
answering a chat between every two denoising steps, as the colocated stage interleaves them;
its replies are compared with a reasoner of its own). The speed of a rank group or of
colocation is not this main thread's CPU time (benchmarks/parallel.py and
benchmarks/colocation.py measure it), so it is left out for them. Not here: DFlash (a reasoner
lever: benchmarks/dflash_world.py measures the drafter trained against the world reasoner).

    .venv/bin/python benchmarks/quality_levers.py [--num-prompts 40] [--threads 1]

Prints a markdown table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
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


def load(model: Path, lever: dict[str, Any], scratch: Path) -> Any:
    from worldserve.models import registry

    if lever.get("fp8"):
        model = fp8_copy(model, scratch / "world-fp8")
    if "parallel" in lever:
        from worldserve.config import GenerationStageConfig
        from worldserve.ranks.runner import start_rank_runner

        config = GenerationStageConfig(model_path=model, parallel=lever["parallel"],
                                       start_timeout_s=900)
        return start_rank_runner(config, model)
    runner = registry.load_runner("generation", model)
    if "step_cache" in lever:
        runner.enable_step_cache(StepCacheSettings(**lever["step_cache"]))
    if lever.get("kv_reuse"):
        runner.configure_speed(understanding_kv_reuse=True)
    if lever.get("compile"):
        runner.configure_speed(compile=True)
    if "vae_tiling" in lever:
        runner.configure_vae(True, *lever["vae_tiling"])
    if lever.get("colocated"):
        return Colocated(runner, model)
    return runner


def fp8_copy(model: Path, target: Path) -> Path:
    """`model` with its generator transformer quantised to FP8 (ModelOpt's exported layout,
    per-tensor scales), the rest as it is."""
    import shutil

    from worldserve.levers.fp8 import dev

    shutil.copytree(model, target)
    dev.quantise_exported(target / "transformer", target / "transformer" / "config.json",
                          quant_config={"quant_method": "modelopt", "quant_type": "FP8"})
    return target


class Colocated:
    """The generation runner with the world reasoner tied to its weights (one copy, as the
    colocated stage loads them) answering a chat between every two denoising steps."""

    QUESTION = "What colour is the shape?"

    def __init__(self, runner: Any, model: Path) -> None:
        from worldserve.config import ReasonerStageConfig, ServerConfig
        from worldserve.engines.reasoner.engine import ReasonerEngine

        self.runner, self.model = runner, model
        self.reasoner = ReasonerEngine(ReasonerStageConfig(model_path=model), ServerConfig())
        assert (self.reasoner.runner.model.get_input_embeddings().weight
                is runner.pipe.transformer.embed_tokens.weight), "the reasoner is not tied"
        self.asked: list[Any] = []
        self.replies: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)

    def denoise_step(self, state: Any) -> None:
        self.runner.denoise_step(state)
        request = self.chat(len(self.asked))
        self.asked.append(request)
        self.replies.append(answer(self.reasoner, request))

    def chat(self, index: int) -> Any:
        """A world frame (a seeded scene) and the colour question, sampled with a seed."""
        from worldserve.ipc.capabilities import ReasonerSampling
        from worldserve.ipc.messages import ChatCompletion, ChatMessage, ChatPart
        from worldserve.models.dev.world.render import png_bytes
        from worldserve.models.dev.world.scenes import make_clip

        frame = png_bytes(make_clip(index % 50, "motion").frames[0])
        return ChatCompletion(
            request_id=f"colocated-{index}", sampling=ReasonerSampling(
                max_tokens=8, temperature=0.7, seed=index),
            messages=[ChatMessage(role="user", parts=[
                ChatPart(type="image", image=frame), ChatPart(type="text", text=self.QUESTION)])])

    def replies_alone(self) -> list[str]:
        """The same chats answered by a reasoner with weights of its own, nothing between."""
        from worldserve.config import ReasonerStageConfig, ServerConfig
        from worldserve.engines.reasoner.engine import ReasonerEngine
        from worldserve.levers import shared

        shared.withdraw(self.model, shared.GENERATOR_TRANSFORMER)
        alone = ReasonerEngine(ReasonerStageConfig(model_path=self.model), ServerConfig())
        assert (alone.runner.model.get_input_embeddings().weight
                is not self.runner.pipe.transformer.embed_tokens.weight)
        return [answer(alone, request) for request in self.asked]


def answer(engine: Any, request: Any) -> str:
    out: list = []
    engine.submit(request, out.append)
    while engine.has_work():
        engine.step()
    return out[-1].text


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
    out["fp8 w8a16"] = {"fp8": True}
    if args.compile:
        out["compile"] = {"compile": True}
    for layout in args.parallel:
        out[layout] = {"parallel": layout}
    out["colocated"] = {"colocated": True}
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


def measure(model: Path, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    jobs = ([(p, 1) for p in sample_prompts(args.seed, args.num_prompts, "image")]
            + [(p, DEFAULTS["num_frames"]) for p in sample_prompts(args.seed, args.num_prompts)])
    plain: dict[int, np.ndarray] = {}
    results = {}
    for name, lever in levers(args).items():
        runner = load(model, lever, scratch)
        for prompt, frames in (jobs[0], jobs[-1]):  # warm-up at both shapes (compiles)
            run(runner, prompt, frames, args.seed, "step_cache" in lever, args.steps)
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
            "psnr_db_min": round(float(min(psnrs)), 2) if psnrs else None,
            "forwards_skipped": f"{skipped}/{forwards}" if forwards else None,
            "cpu_s": None if "parallel" in lever or lever.get("colocated") else round(cpu, 2)}
        if lever.get("colocated"):
            alone = runner.replies_alone()
            results[name]["reasoner_replies_equal"] = (
                f"{sum(a == b for a, b in zip(runner.replies, alone))}/{len(alone)}")
        if "parallel" in lever:
            runner.group.close()
    base = results["plain"]["cpu_s"]
    for figures in results.values():
        figures["speedup_cpu"] = round(base / figures["cpu_s"], 3) if figures["cpu_s"] else None
    return results


def table(results: dict[str, Any]) -> str:
    keys = ["image_colour", "image_shape", "video_colour", "video_direction",
            "psnr_db_vs_plain", "psnr_db_min", "forwards_skipped", "speedup_cpu"]
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
    parser.add_argument("--parallel", nargs="*", default=["cfg=2", "ulysses=2"],
                        help="rank-group layouts (stages.generation.parallel)")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                        help="the compile lever (inductor: minutes of compiling on a CPU)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    root = envs.dev_models_dir()
    subprocess.run([sys.executable, "-m", "worldserve", "dev-models", "build", str(root)],
                   check=True)
    with tempfile.TemporaryDirectory(prefix="quality-levers-") as scratch:
        results = measure(root / "world", args, Path(scratch))
    print(table(results))
    print(json.dumps({"num_prompts": args.num_prompts, "steps": args.steps,
                      "levers": results}))


if __name__ == "__main__":
    main()
