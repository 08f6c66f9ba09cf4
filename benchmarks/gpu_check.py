"""The first-GPU check, prepared: one script, no real weights, under 8 minutes on one H200.

    .venv/bin/python benchmarks/gpu_check.py [--parts plan,generator,reasoner,parallel]
    .venv/bin/python benchmarks/gpu_check.py --tiny        # CPU, tiny shapes (the unit test)

Parts (`PARTS`; each `part(setup, tmp) -> dict`, run in the order given, memory freed between):

  plan       the machine's GPUs and the placement plan of a Nano- and a Super-sized checkpoint
             (element counts from notes/gpu-readiness.md; runtime/placement.py), and the plan of
             the dev checkpoints as `worldserve check` makes it;
  load       host memory while the Cosmos3 loader reads a random ~1.5 B-parameter generator
             onto the GPU: straight there (device_map, the loader now) vs a host copy and
             `.to(device)` (the loader before); anonymous RSS peak and seconds each;
  generator  a full-size random-weight Cosmos3-Nano-shaped generator (diffusers' class defaults:
             hidden 4096, 36 layers, 32/8 heads; the Wan 2.2 VAE) in bf16 through worldserve's
             runner (`Cosmos3Runner.prepare` / `denoise_step`, CFG 6: a cond and an uncond
             forward per step), seconds per step at 480p and 720p (189 frames), with the
             `native` attention backend and `flash` (else `_native_cudnn`) when available; peak
             memory per size;
  reasoner   a Nano-shaped random reasoner (Cosmos3 Omni, text: hidden 4096, 36 layers, 32/8
             heads, vocabulary 151,936; the dev ViT) through worldserve's reasoner engine:
             ms per token at batch 1 and 4 (benchmarks/reasoner_decode.py's measure);
  parallel   benchmarks/parallel.py `part_parallel` (rank groups on the GPUs there are);
  fp8        benchmarks/fp8.py `part_fp8`, when that module exists.

Prints one JSON object (every part's figures) and a table. `--tiny`: tiny shapes on the CPU in
float32 (a unit test runs it end to end); the figures then mean nothing. Never run on CUDA from
this repository's sessions so far: see docs/hardware.md for what is verified.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZES = {"480p": (480, 832), "720p": (720, 1280)}
TINY_SIZES = {"tiny": (32, 48)}
PROMPT = "a robot arm picks up the blue cup and places it on the shelf"
NANO_TEXT = dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
                 num_key_value_heads=8, head_dim=128, intermediate_size=12288,
                 vocab_size=151_936,
                 rope_parameters={"mrope_interleaved": True, "mrope_section": [24, 20, 20],
                                  "rope_theta": 5_000_000.0, "rope_type": "default"})

Part = Callable[[argparse.Namespace, Path], dict[str, Any]]


def _device(setup: argparse.Namespace) -> str:
    return "cpu" if setup.dry_run else "cuda"


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _reset_peak(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def _peak_gib(device: str) -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else None


def _free() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------ plan


def part_plan(setup: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """The GPUs, and the plan of Nano / Super element counts and of the dev checkpoints."""
    from worldserve.config import build_config
    from worldserve.runtime.devices import server_plan, visible_gpus
    from worldserve.runtime.placement import Arch, StageDemand, Workload, plan_placement

    gpus = visible_gpus()
    arch = Arch(hidden_size=4096, num_layers=36, num_kv_heads=8, head_dim=128, vae_width=256)
    gen_work = Workload(activation_tokens=44_672, output_pixels=1280 * 720 * 189)
    reasoner_work = Workload(kv_tokens=6 * 7000, prefill_tokens=2048)
    out: dict[str, Any] = {"gpus": [g.__dict__ for g in gpus]}
    for name, (gen, reasoner) in {"nano": (15_170_000_000, 8_770_000_000),
                                  "super": (64_000_000_000, 32_000_000_000)}.items():
        plan = plan_placement(gpus, [
            StageDemand("generation", "auto", "auto", {"BF16": gen}, arch, gen_work),
            StageDemand("reasoner", "auto", "auto", {"BF16": reasoner}, arch, reasoner_work)])
        out[name] = plan.to_json()
    from worldserve import envs

    root = envs.dev_models_dir()
    if (root / "generation" / "model_index.json").is_file():
        config = build_config({}, {"stages.generation.model_path": str(root / "generation"),
                                   "stages.reasoner.model_path": str(root / "generation"),
                                   "stages.realtime.enabled": False})
        out["dev"] = server_plan(config, gpus)[0].to_json()
    return out


# ------------------------------------------------------------------------------- generator


def _backends(transformer: Any, device: str) -> list[str]:
    """`native`, then `flash` or `_native_cudnn`, whichever this machine can set (CUDA only)."""
    names = ["native"]
    if device != "cuda":
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
        _sync(device)
        start = time.perf_counter()
        runner.denoise_step(state)
        _sync(device)
        times.append(time.perf_counter() - start)
    return times


def part_generator(setup: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Seconds per denoising step through `Cosmos3Runner`, per size and attention backend."""
    import torch

    from benchmarks.parallel import _random_pipeline
    from worldserve.ipc.messages import GenerationParams
    from worldserve.models.cosmos3.runner import Cosmos3Runner

    device = _device(setup)
    dtype = torch.float32 if setup.dry_run else torch.bfloat16
    started = time.perf_counter()
    runner = Cosmos3Runner(_random_pipeline(device, dtype, setup.dry_run))
    build_s = time.perf_counter() - started
    params_count = sum(p.numel() for p in runner.pipe.transformer.parameters())
    frames = setup.frames
    out: dict[str, Any] = {"transformer_params": params_count, "frames": frames,
                           "timed_steps": setup.steps, "build_s": round(build_s, 1),
                           "dtype": str(dtype).removeprefix("torch."), "runs": {}}
    transformer = runner.pipe.transformer
    for backend in _backends(transformer, device):
        transformer.set_attention_backend(backend)
        for size, (height, width) in (TINY_SIZES if setup.dry_run else SIZES).items():
            params = GenerationParams(prompt=PROMPT, width=width, height=height,
                                      num_frames=frames, num_inference_steps=setup.steps + 2,
                                      guidance_scale=6.0, seeds=[7], fps=24.0)
            _reset_peak(device)
            try:
                times = _time_steps(runner, params, setup.steps, device)
            except Exception as exc:  # e.g. a backend that refuses Cosmos3's masks
                out["runs"][f"{backend}/{size}"] = {"error": f"{type(exc).__name__}: {exc}"}
                _free()
                continue
            out["runs"][f"{backend}/{size}"] = {
                "s_per_step": round(statistics.median(times[1:]), 3),
                "first_step_s": round(times[0], 3), "peak_gib": _peak_gib(device)}
    native = {k.split("/")[1]: v["s_per_step"] for k, v in out["runs"].items()
              if k.startswith("native/") and "s_per_step" in v}
    for key, run in out["runs"].items():
        base = native.get(key.split("/")[1])
        if "s_per_step" in run and base:
            run["vs_native"] = round(run["s_per_step"] / base, 3)
    del runner, transformer
    _free()
    return out


# -------------------------------------------------------------------------------- reasoner


def _nano_reasoner_runner(dev_dir: Path, device: str, dtype: Any, full: bool) -> Any:
    """worldserve's reasoner runner around a random Cosmos3 Omni of Nano text shape (tiny:
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


def _frame_png(size: int = 224) -> bytes:
    import io

    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 255, (size, size, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def part_reasoner(setup: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """ms per token of the reasoner engine's decode steps at batch 1 and 4."""
    import torch

    from benchmarks.reasoner_decode import DecodeBench
    from worldserve import envs
    from worldserve.engines.reasoner import engine as reasoner_engine

    device = _device(setup)
    dtype = torch.float32 if setup.dry_run else torch.bfloat16
    dev_dir = envs.dev_models_dir() / "cosmos3-reasoner"
    started = time.perf_counter()
    runner = _nano_reasoner_runner(dev_dir, device, dtype, full=not setup.dry_run)
    build_s = time.perf_counter() - started
    original = reasoner_engine.registry.load_runner
    # the engine loads through the registry: hand it the random model
    reasoner_engine.registry.load_runner = lambda *_, built=runner, **__: built
    try:
        bench = DecodeBench(dev_dir, "after", _frame_png(64 if setup.dry_run else 224),
                            setup.max_tokens)
    finally:
        reasoner_engine.registry.load_runner = original
    out: dict[str, Any] = {"params": sum(p.numel() for p in runner.model.parameters()),
                           "build_s": round(build_s, 1), "max_tokens": setup.max_tokens,
                           "dtype": str(dtype).removeprefix("torch.")}
    for batch in (1, 4):
        bench.measure(batch)  # warm-up
        _reset_peak(device)
        runs = [bench.measure(batch) for _ in range(setup.repeats)]
        out[f"b{batch}"] = {
            "ms_per_token": round(statistics.median(r["s"] * 1000 / r["rows"] for r in runs), 2),
            "ms_per_step": round(statistics.median(r["s"] * 1000 / r["steps"] for r in runs), 2),
            "tokens": sum(r["rows"] for r in runs), "peak_gib": _peak_gib(device)}
    bench.engine.shutdown()
    del bench, runner
    _free()
    return out


# ------------------------------------------------------------------------------------ load

# A child process loads the checkpoint with worldserve's Cosmos3 loader and samples its
# anonymous resident memory (RssAnon: host copies of tensors; file pages that safetensors maps
# are not counted) while it does.
LOAD_CHILD = r"""
import json, sys, threading, time
def anon():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0
import torch
import worldserve.models.common as common
from worldserve.models.cosmos3.loader import load_pipeline
model_dir, device, mode = sys.argv[1:4]
if mode == "host_copy":  # the loader before: read into host memory, then pipe.to(device)
    common.direct_device_map = lambda device: None
import diffusers  # imports and the CUDA context before the baseline: only the load is counted
diffusers.Cosmos3OmniPipeline
torch.zeros(1, device=device)
peak, done = [anon()], []
base = peak[0]
def sample():
    while not done:
        peak.append(anon()); time.sleep(0.002)
thread = threading.Thread(target=sample, daemon=True); thread.start()
start = time.perf_counter()
pipe = load_pipeline(model_dir, "bfloat16", device)
if device == "cuda":
    torch.cuda.synchronize()
seconds = time.perf_counter() - start
done.append(1); thread.join()
where = {str(p.device) for p in pipe.transformer.parameters()}
gpu = torch.cuda.memory_allocated() / 2**30 if device == "cuda" else None
print(json.dumps({"load_s": round(seconds, 2), "devices": sorted(where),
                  "host_anon_peak_gib": round((max(peak) - base) / 2**30, 3),
                  "gpu_gib": round(gpu, 2) if gpu is not None else None}))
"""
LOAD_SHAPE = dict(hidden_size=2048, head_dim=128, num_attention_heads=16, num_key_value_heads=4,
                  intermediate_size=6144, num_hidden_layers=12)


def part_load(setup: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Host memory while the Cosmos3 loader reads a random ~1.5 B-parameter generator onto the
    device: straight there (diffusers device_map, the loader now) vs through a host copy and
    `.to(device)` (the loader before). Tiny: the dev shape on the CPU (both ways load into host
    memory there)."""
    import subprocess

    import torch
    from diffusers import Cosmos3OmniTransformer

    from benchmarks.parallel import _random_pipeline, nano_shape

    device = _device(setup)
    pipe = _random_pipeline("cpu", torch.bfloat16, dry_run=True)
    shape = nano_shape(True) if setup.dry_run else LOAD_SHAPE
    with torch.device("cpu"):
        torch.set_default_dtype(torch.bfloat16)
        try:
            pipe.transformer = Cosmos3OmniTransformer(**shape).eval()
        finally:
            torch.set_default_dtype(torch.float32)
    pipe.register_modules(transformer=pipe.transformer)
    params = sum(p.numel() for p in pipe.transformer.parameters())
    target = tmp / "load-model"
    pipe.save_pretrained(target)
    del pipe
    _free()
    out: dict[str, Any] = {"transformer_params": params, "file_gib": round(sum(
        f.stat().st_size for f in target.rglob("*.safetensors")) / 2**30, 3)}
    for mode in ("direct", "host_copy"):
        done = subprocess.run([sys.executable, "-c", LOAD_CHILD, str(target), device, mode],
                              capture_output=True, text=True, timeout=300,
                              cwd=Path(__file__).resolve().parents[1])
        if done.returncode != 0:
            raise RuntimeError(f"{mode} load failed: {done.stderr.strip()[-400:]}")
        out[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    host = out["host_copy"]["host_anon_peak_gib"]
    out["direct_vs_host_copy_anon"] = round(out["direct"]["host_anon_peak_gib"] / host, 3) \
        if host > 0 else None
    return out


# ----------------------------------------------------------------------------------- parts


def _lazy(module: str, function: str) -> Part:
    """A part that lives in another benchmark module, imported when it runs."""

    def part(setup: argparse.Namespace, tmp: Path) -> dict[str, Any]:
        return getattr(importlib.import_module(f"benchmarks.{module}"), function)(setup, tmp)

    return part


PARTS: dict[str, Part] = {"plan": part_plan, "load": part_load, "generator": part_generator,
                          "reasoner": part_reasoner,
                          "parallel": _lazy("parallel", "part_parallel")}


def part_fp8(setup: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """benchmarks/fp8.py's `part_fp8`: this part signature, or `part_fp8(report) -> list`
    (a W8A16 and a W8A8 result, each also handed to `report` as it is measured)."""
    import inspect

    fp8 = importlib.import_module("benchmarks.fp8")
    if len(inspect.signature(fp8.part_fp8).parameters) == 2:
        return fp8.part_fp8(setup, tmp)
    return {"results": fp8.part_fp8(lambda result: print(f"gpu_check: fp8 {result}",
                                                         file=sys.stderr))}


if (Path(__file__).parent / "fp8.py").is_file():  # written by the FP8 work
    PARTS["fp8"] = part_fp8


def run_parts(setup: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    import torch

    result: dict[str, Any] = {"benchmark": "gpu_check", "tiny": setup.dry_run,
                              "cuda": torch.cuda.is_available(), "torch": torch.__version__,
                              "parts": {}}
    if torch.cuda.is_available():
        result["device"] = torch.cuda.get_device_name()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        device = "cuda" if torch.cuda.is_available() and not setup.dry_run else "cpu"
        for name in names:
            started = time.perf_counter()
            _reset_peak(device)
            try:
                got = PARTS[name](setup, Path(tmp))
            except Exception as exc:  # one broken part must not hide the others' figures
                got = {"error": f"{type(exc).__name__}: {exc}"}
                print(f"gpu_check: part {name} failed", file=sys.stderr)
                import traceback

                traceback.print_exc()
            got["part_s"] = round(time.perf_counter() - started, 1)
            got["part_peak_gib"] = _peak_gib(device)  # this process (not its children)
            result["parts"][name] = got
            _free()
    return result


def table(result: dict[str, Any]) -> list[str]:
    """The headline figures, one row each."""
    rows = [("part", "figure", "value")]
    parts = result["parts"]
    plan = parts.get("plan", {})
    for model in ("nano", "super"):
        if model in plan:
            stages = plan[model]["stages"]
            where = ", ".join(f"{n}: {s['device']}{s['gpus'] or ''}" for n, s in stages.items())
            rows.append(("plan", f"{model} ({where})",
                         "fits" if plan[model]["fits"] else "DOES NOT FIT"))
    for key, run in parts.get("generator", {}).get("runs", {}).items():
        rows.append(("generator", f"{key} s/step (peak GiB)",
                     f"{run['s_per_step']} ({run['peak_gib']})" if "s_per_step" in run
                     else run["error"][:80]))
    for mode in ("direct", "host_copy"):
        if mode in parts.get("load", {}):
            got = parts["load"][mode]
            rows.append(("load", f"{mode}: host anon peak GiB / s",
                         f"{got['host_anon_peak_gib']} / {got['load_s']}"))
    for batch in ("b1", "b4"):
        if batch in parts.get("reasoner", {}):
            got = parts["reasoner"][batch]
            rows.append(("reasoner", f"{batch} ms/token (peak GiB)",
                         f"{got['ms_per_token']} ({got['peak_gib']})"))
    for run in parts.get("parallel", {}).get("runs", []):
        rows.append(("parallel", f"{run['gpus']} GPU {run['layout']} s/step",
                     f"{run['step_s']} (x{run['speedup']})"))
    for got in parts.get("fp8", {}).get("results", []):
        rows.append(("fp8", str(got.get("part")), ", ".join(
            f"{k}={v}" for k, v in got.items() if k not in ("part", "generator_layout"))[:100]))
    for name, got in parts.items():
        if "error" in got:
            rows.append((name, "error", got["error"][:80]))
        rows.append((name, "seconds (peak GiB)", f"{got['part_s']} ({got['part_peak_gib']})"))
    width = [max(len(str(r[i])) for r in rows) for i in range(3)]
    return ["  ".join(str(c).ljust(w) for c, w in zip(r, width)) for r in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated, from: {', '.join(PARTS)}")
    parser.add_argument("--tiny", dest="dry_run", action="store_true",
                        help="tiny shapes on the CPU (the unit test)")
    parser.add_argument("--steps", type=int, default=None,
                        help="timed denoising steps per size [2; tiny 1]")
    parser.add_argument("--frames", type=int, default=None, help="[189; tiny 1]")
    parser.add_argument("--max-tokens", type=int, default=None, help="per reply [48; tiny 6]")
    parser.add_argument("--repeats", type=int, default=None, help="timed replies [2; tiny 1]")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    setup = parser.parse_args(argv)
    for key, full, tiny in (("steps", 2, 1), ("frames", 189, 1), ("max_tokens", 48, 6),
                            ("repeats", 2, 1)):
        if getattr(setup, key) is None:
            setattr(setup, key, tiny if setup.dry_run else full)
    names = [n.strip() for n in setup.parts.split(",") if n.strip()]
    unknown = [n for n in names if n not in PARTS]
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; known: {', '.join(PARTS)}")
    result = run_parts(setup, names)
    for line in table(result):
        print(line)
    text = json.dumps(result)
    print(text)
    if setup.out is not None:
        setup.out.write_text(text + "\n")
    return 1 if any("error" in got for got in result["parts"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
