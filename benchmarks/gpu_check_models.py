"""benchmarks/gpu_check.py's `generator` and `reasoner` parts: full-size random-weight Nano-shaped
models built on the device (no checkpoint, no download) through worldserve's runner and
reasoner engine; on the CPU (`setup.small`) tiny shapes in float32, whose figures mean nothing.
Parts write their figures into `out` as they measure them (benchmarks/gpu_check_parts.py)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.gpu_check_parts import Figures, frame_png, free, peak_gib, reset_peak, sync

SIZES = {"480p": (480, 832), "720p": (720, 1280)}
SMALL_SIZES = {"tiny": (32, 48)}
PROMPT = "a robot arm picks up the blue cup and places it on the shelf"
NANO_TEXT = dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
                 num_key_value_heads=8, head_dim=128, intermediate_size=12288,
                 vocab_size=151_936,
                 rope_parameters={"mrope_interleaved": True, "mrope_section": [24, 20, 20],
                                  "rope_theta": 5_000_000.0, "rope_type": "default"})


def _dtype(setup: argparse.Namespace) -> Any:
    import torch

    return torch.float32 if setup.small else torch.bfloat16


# ------------------------------------------------------------------------------- generator


def _backends(transformer: Any, device: str) -> list[str]:
    """`native`, then `flash` or `_native_cudnn`, whichever this machine can set (CUDA only).
    On sm90 with a recent cuDNN, plain SDPA may already pick cuDNN: `native` vs `_native_cudnn`
    then reads about 1.0 (notes/gpu-first-contact.md §9)."""
    names = ["native"]
    if device != "cuda":
        print("gpu_check: flash and _native_cudnn attention are tried on CUDA only",
              file=sys.stderr)
        return names
    for candidate in ("flash", "_native_cudnn"):
        try:
            transformer.set_attention_backend(candidate)
        except (ImportError, RuntimeError, ValueError) as exc:
            print(f"gpu_check: attention backend {candidate} unavailable: {exc}",
                  file=sys.stderr)
            continue
        names.append(candidate)
        break
    return names


def _time_steps(runner: Any, params: Any, steps: int, device: str) -> list[float]:
    state = runner.prepare(["bench"], [params], params.seeds)
    times = []
    for _ in range(steps + 1):  # the first step warms up
        sync(device)
        start = time.perf_counter()
        runner.denoise_step(state)
        sync(device)
        times.append(time.perf_counter() - start)
    return times


def _step_run(runner: Any, params: Any, setup: argparse.Namespace) -> Figures:
    reset_peak(setup.device)
    try:
        times = _time_steps(runner, params, setup.steps, setup.device)
    except Exception as exc:  # e.g. a backend that refuses Cosmos3's masks: the next one runs
        free()
        return {"error": f"{type(exc).__name__}: {exc}"[:400]}
    return {"s_per_step": round(statistics.median(times[1:]), 3),
            "first_step_s": round(times[0], 3), "peak_gib": peak_gib(setup.device)}


def part_generator(setup: argparse.Namespace, tmp: Path, out: Figures) -> None:
    """Seconds per denoising step (CFG 6: a cond and an uncond forward) through `Cosmos3Runner`
    of a random Nano-shaped generator (diffusers' class defaults: hidden 4096, 36 layers, 32/8
    heads; the Wan 2.2 VAE), per size (480p first) and attention backend."""
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    from benchmarks.parallel import _random_pipeline
    from worldserve.ipc.messages import GenerationParams
    from worldserve.models.cosmos3.runner import Cosmos3Runner

    runner, build_s = harness.timed(
        lambda: Cosmos3Runner(_random_pipeline(setup.device, _dtype(setup), setup.small)))
    transformer = runner.pipe.transformer
    out.update(transformer_params=sum(p.numel() for p in transformer.parameters()),
               frames=setup.frames, timed_steps=setup.steps, build_s=round(build_s, 1),
               dtype=str(_dtype(setup)).removeprefix("torch."), runs={})
    active = _AttentionBackendRegistry._active_backend  # set_attention_backend changes it
    try:
        backends = out["backends"] = _backends(transformer, setup.device)
        for size, (height, width) in (SMALL_SIZES if setup.small else SIZES).items():
            params = GenerationParams(prompt=PROMPT, width=width, height=height,
                                      num_frames=setup.frames,
                                      num_inference_steps=setup.steps + 2, guidance_scale=6.0,
                                      seeds=[7], fps=24.0)
            for backend in backends:
                transformer.set_attention_backend(backend)
                run = out["runs"][f"{backend}/{size}"] = _step_run(runner, params, setup)
                base = out["runs"][f"native/{size}"].get("s_per_step")
                if "s_per_step" in run and base:
                    run["vs_native"] = round(run["s_per_step"] / base, 3)
    finally:  # the process-wide default back for the parts after this one
        transformer.reset_attention_backend()
        _AttentionBackendRegistry.set_active_backend(active)
    del runner, transformer
    free()


# -------------------------------------------------------------------------------- reasoner


def _nano_reasoner_runner(dev_dir: Path, device: str, dtype: Any, full: bool) -> Any:
    """worldserve's reasoner runner around a random Cosmos3 Omni of Nano text shape (small:
    the dev one's shape), with the dev directory's processor."""
    import torch
    from transformers import Cosmos3OmniConfig, Cosmos3OmniForConditionalGeneration

    from benchmarks.reasoner_decode import LOGIT_SCALE
    from worldserve.models.cosmos3_reasoner.loader import VIDEO_STYLES
    from worldserve.models.qwen_vl.processor import load_vlm
    from worldserve.models.qwen_vl.runner import QwenVLRunner

    _, processor = load_vlm(dev_dir, dtype="float32", device="cpu")
    config = json.loads((dev_dir / "config.json").read_text())
    if full:
        config["text_config"].update(NANO_TEXT)
        # the ViT stays the dev one; its merger feeds the text width
        config["vision_config"]["out_hidden_size"] = NANO_TEXT["hidden_size"]
    kwargs = {k: v for k, v in config.items()
              if k not in ("architectures", "transformers_version", "model_type")}
    torch.manual_seed(0)
    with torch.device(device):
        torch.set_default_dtype(dtype)
        try:
            model = Cosmos3OmniForConditionalGeneration(Cosmos3OmniConfig(**kwargs)).eval()
        finally:
            torch.set_default_dtype(torch.float32)
    with torch.no_grad():  # logits spread like a trained model's (reasoner_decode.py)
        model.model.language_model.norm.weight.fill_(LOGIT_SCALE)
    generation = json.loads((dev_dir / "generation_config.json").read_text())
    model.generation_config.eos_token_id = generation.get("eos_token_id")
    return QwenVLRunner(model, processor, VIDEO_STYLES[model.config.model_type])


def _decode_bench(dev_dir: Path, runner: Any, setup: argparse.Namespace,
                  arm: str = "after") -> Any:
    """The reasoner engine of benchmarks/reasoner_decode.py around `runner` (the engine loads
    through the registry: it is handed the random model)."""
    from benchmarks.reasoner_decode import DecodeBench
    from worldserve.engines.reasoner import engine as reasoner_engine

    original = reasoner_engine.registry.load_runner
    reasoner_engine.registry.load_runner = lambda *_, built=runner, **__: built
    try:
        return DecodeBench(dev_dir, arm, frame_png(64 if setup.small else 224),
                           setup.max_tokens, stage={"device": setup.device})
    finally:
        reasoner_engine.registry.load_runner = original


def _decode_figures(dev_dir: Path, runner: Any, setup: argparse.Namespace, arm: str) -> Figures:
    """ms per token and step at batch 1 and 4 of one arm (`replies`: the first run's tokens
    per batch; graphs: `captures`, `replays`)."""
    figures: Figures = {"replies": []}
    bench = _decode_bench(dev_dir, runner, setup, arm)
    try:
        for batch in (1, 4):
            bench.measure(batch)  # warm-up (captures, for graphs)
            reset_peak(setup.device)
            runs = [bench.measure(batch) for _ in range(setup.repeats)]
            figures["replies"].append(runs[0]["tokens"])
            figures[f"b{batch}"] = {
                "ms_per_token": round(statistics.median(
                    r["s"] * 1000 / r["rows"] for r in runs), 2),
                "ms_per_step": round(statistics.median(
                    r["s"] * 1000 / r["steps"] for r in runs), 2),
                "tokens": sum(r["rows"] for r in runs), "peak_gib": peak_gib(setup.device)}
        graphs = bench.engine.steps.runner.static.graphs
        if graphs is not None:
            figures.update(captures=graphs.captures, replays=graphs.replays)
    finally:
        bench.engine.shutdown()
    return figures


def part_reasoner(setup: argparse.Namespace, tmp: Path, out: Figures) -> None:
    """ms per token of the reasoner engine's decode steps at batch 1 and 4, on a random Cosmos3
    Omni of Nano's text shape (hidden 4096, 36 layers, 32/8 heads, vocabulary 151,936; the dev
    ViT); then the same with the steps captured as CUDA graphs (`cuda_graphs`): ms per token,
    the ratio, graphs captured, and whether the sampled tokens came out the same (the captured
    step attends over whole buffers, masked: bf16 rounding may differ)."""
    from worldserve import envs

    dev_dir = envs.dev_models_dir() / "cosmos3-reasoner"
    runner, build_s = harness.timed(_nano_reasoner_runner, dev_dir, setup.device,
                                    _dtype(setup), not setup.small)
    out.update(params=sum(p.numel() for p in runner.model.parameters()),
               build_s=round(build_s, 1), max_tokens=setup.max_tokens,
               dtype=str(_dtype(setup)).removeprefix("torch."))
    out.update(_decode_figures(dev_dir, runner, setup, "after"))
    replies = out.pop("replies")
    try:  # the captured step has never run on CUDA: its failure is its own
        graphs = _decode_figures(dev_dir, runner, setup, "graphs")
    except Exception as exc:
        out["graphs"] = {"error": f"{type(exc).__name__}: {exc}"[:1000]}
    else:
        for batch in ("b1", "b4"):
            graphs[batch]["vs_static"] = round(
                graphs[batch]["ms_per_token"] / out[batch]["ms_per_token"], 3)
        graphs["tokens_equal"] = graphs.pop("replies") == replies
        out["graphs"] = graphs
    del runner
    free()
