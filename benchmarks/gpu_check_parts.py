"""benchmarks/gpu_check.py's `plan`, `fp8` and `load` parts, and the device helpers every part
uses. A part is `part(setup, tmp, out)`: it writes its figures into `out` as it measures them,
so that a part stopped by its time budget still reports what it had (benchmarks/gpu_check.py
runs the parts; `setup.device` is `cuda` or `cpu`, `setup.small` the CPU's tiny sizes)."""

from __future__ import annotations

import argparse
import gc
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks import harness

Figures = dict[str, Any]


# ---------------------------------------------------------------------------- device helpers


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def reset_peak(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def peak_gib(device: str) -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else None


def free() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def frame_png(size: int) -> bytes:
    """A random RGB frame, PNG-encoded (what a client sends the reasoner)."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 255, (size, size, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


# ------------------------------------------------------------------------------------ plan


def part_plan(setup: argparse.Namespace, tmp: Path, out: Figures) -> None:
    """The GPUs, and the plan of Nano / Super element counts and of the dev checkpoints."""
    from worldserve import envs
    from worldserve.config import build_config
    from worldserve.runtime.devices import server_plan, visible_gpus
    from worldserve.runtime.placement import Arch, StageDemand, Workload, plan_placement

    gpus = visible_gpus()
    out["gpus"] = [g.__dict__ for g in gpus]
    arch = Arch(hidden_size=4096, num_layers=36, num_kv_heads=8, head_dim=128, vae_width=256)
    gen_work = Workload(activation_tokens=44_672, output_pixels=1280 * 720 * 189)
    reasoner_work = Workload(kv_tokens=6 * 7000, prefill_tokens=2048)
    # element counts from notes/gpu-readiness.md; Super's reuses Nano's Arch (an estimate:
    # benchmarks/rehearse.py plans from the published configurations)
    for name, (gen, reasoner) in {"nano": (15_170_000_000, 8_770_000_000),
                                  "super": (64_000_000_000, 32_000_000_000)}.items():
        plan = plan_placement(gpus, [
            StageDemand("generation", "auto", "auto", {"BF16": gen}, arch, gen_work),
            StageDemand("reasoner", "auto", "auto", {"BF16": reasoner}, arch, reasoner_work)])
        out[name] = plan.to_json()
    root = envs.dev_models_dir()  # built by gpu_check before any part
    config = build_config({}, {"stages.generation.model_path": str(root / "generation"),
                               "stages.reasoner.model_path": str(root / "generation"),
                               "stages.realtime.enabled": False})
    out["dev"] = server_plan(config, gpus)[0].to_json()


# ------------------------------------------------------------------------------------- fp8


def part_fp8(setup: argparse.Namespace, tmp: Path, out: Figures) -> None:
    """The FP8 reasoner decoding through the reasoner engine, W8A8 where the device allows:
    a tiny FP8 Cosmos3 directory (quantised here from the dev generator) served by two engines,
    the static decode step and transformers' forward; their tokens and ms/token. On the CPU
    W8A8 is forced as the unit tests force it (`Fp8Linear` runs there; the `_scaled_mm` CUDA
    kernel does not). On CUDA also benchmarks/fp8.py's W8A8-vs-W8A16 comparison."""
    from benchmarks.fp8 import part_w8a8
    from worldserve.levers.fp8 import load

    quantised = _fp8_directory(tmp / "fp8", out, generator=setup.device == "cuda")
    missing = load._w8a8_missing(setup.device, load.reasoner_format(quantised), False)
    forced = missing is not None and setup.device == "cpu"
    compute = "w8a8" if missing is None or forced else "w8a16"
    out["compute"] = compute + (f" (forced: {missing})" if forced else "")
    original = load._w8a8_missing
    if forced:
        load._w8a8_missing = lambda *args: None
    try:
        _engine_decode(setup, quantised, compute, out)
    finally:
        load._w8a8_missing = original
    out["w8a8_vs_w8a16"] = part_w8a8(quantised, "cuda") if setup.device == "cuda" else {
        "skipped": "CUDA only (the _scaled_mm kernel)"}


def _fp8_directory(root: Path, out: Figures, generator: bool) -> Path:
    """The dev Cosmos3 directory with its reasoner quantised (the exported ModelOpt layout);
    with `generator`, benchmarks/fp8.py's pair (the generator quantised too, by ModelOpt when
    it is installed), which its W8A8 comparison needs."""
    from benchmarks.fp8 import build_pair
    from worldserve.levers.fp8 import dev
    from worldserve.models.cosmos3.dev import build_generation

    if generator:
        quantised, _, out["generator_layout"] = build_pair(root)
        return quantised
    build_generation(root, 0)
    dev.quantise_exported(root, root / "config.json")
    return root


def _engine_decode(setup: argparse.Namespace, quantised: Path, compute: str,
                   out: Figures) -> None:
    from benchmarks.reasoner_decode import DecodeBench
    from worldserve.levers.fp8.linear import Fp8Linear

    stage = {"device": setup.device, "fp8_compute": compute}
    tokens = {}
    out["engine"] = {}
    for arm in ("after", "sampler"):  # the static decode step, transformers' forward
        bench = DecodeBench(quantised, arm, frame_png(64), setup.max_tokens, stage=stage)
        try:
            path = bench.engine.decode_path
            model = bench.engine.steps.runner.model
            out["fp8_linears"] = sum(isinstance(m, Fp8Linear) for m in model.modules())
            bench.measure(1)  # warm-up
            got = bench.measure(1)
        finally:
            bench.engine.shutdown()
        tokens[path] = got["tokens"]
        out["engine"][path] = {"ms_per_token": round(got["s"] * 1000 / got["rows"], 2),
                               "tokens": sum(len(t) for t in got["tokens"])}
    out["static_equals_eager"] = tokens.get("static") == tokens.get("eager")


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


def part_load(setup: argparse.Namespace, tmp: Path, out: Figures) -> None:
    """Host memory while the Cosmos3 loader reads a random ~1.5 B-parameter generator onto the
    device: straight there (diffusers device_map, the loader now) vs through a host copy and
    `.to(device)` (the loader before). Small: the dev shape on the CPU (both ways load into
    host memory there)."""
    import torch
    from diffusers import Cosmos3OmniTransformer

    from benchmarks.parallel import _random_pipeline, nano_shape

    pipe = _random_pipeline("cpu", torch.bfloat16, dry_run=True)
    shape = nano_shape(True) if setup.small else LOAD_SHAPE
    with torch.device("cpu"):
        torch.set_default_dtype(torch.bfloat16)
        try:
            pipe.transformer = Cosmos3OmniTransformer(**shape).eval()
        finally:
            torch.set_default_dtype(torch.float32)
    pipe.register_modules(transformer=pipe.transformer)
    out["transformer_params"] = sum(p.numel() for p in pipe.transformer.parameters())
    target = tmp / "load-model"
    pipe.save_pretrained(target)
    del pipe
    free()
    out["file_gib"] = round(sum(f.stat().st_size for f in target.rglob("*.safetensors"))
                            / 2**30, 3)
    for mode in ("direct", "host_copy"):
        done = subprocess.run([sys.executable, "-c", LOAD_CHILD, str(target), setup.device, mode],
                              capture_output=True, text=True, timeout=300,
                              cwd=harness.REPO_ROOT)
        if done.returncode != 0:
            raise RuntimeError(f"{mode} load failed: {done.stderr.strip()[-400:]}")
        out[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    host = out["host_copy"]["host_anon_peak_gib"]
    out["direct_vs_host_copy_anon"] = round(out["direct"]["host_anon_peak_gib"] / host, 3) \
        if host > 0 else None
