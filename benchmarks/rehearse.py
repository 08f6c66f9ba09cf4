"""A full-size rehearsal of the published Cosmos3 models without a GPU (issue 31, item 13).

Each model is built from its published configuration (tests/fixtures/published/) under torch's
`FakeTensorMode` and run through worldserve's own code: every op computes its output's shape
and dtype and allocates nothing, so a shape or dtype error anywhere fails the rehearsal as it
would fail the first GPU run, and the live tensor bytes give a peak-memory estimate.

Parts (one JSON line each, `harness.emit`):

- params: parameter counts per component (meta device) against the published figures;
- single: one denoise step with CFG (cond + uncond forwards, the scheduler step) on one device,
  through `Cosmos3Runner.prepare` / `denoise_step`; then the VAE decode of its latents;
- ranks: the same step on each rank of an 8-rank group (torch's fake process group: the
  collectives return at once) through `ParallelCosmos3Runner` and worldserve's mesh, Ulysses,
  Ring and shard code: bytes each rank holds and sends, its peak;
- reasoner: prefill and decode at full size through `QwenVLRunner` with the static decode
  step, then the same with every LLM linear swapped for the W8A8 `Fp8Linear`;
- plan: `worldserve check`'s plan (`server_plan`, the function behind it) for a header-only
  copy of the published directory, against the rehearsal's estimate (rehearse_plan.py).

    python benchmarks/rehearse.py --model nano --parallel cfg=2,ulysses=4
    python benchmarks/rehearse.py --model super --parts params,plan --gpu h100

CPU fake-tensor figures: no GPU ran. Weights and peaks are tensor bytes (no allocator
fragmentation, no CUDA context, no communicator buffers); collectives are bytes sent per rank.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import (
    harness,  # noqa: E402
    rehearse_plan,  # noqa: E402
)
from benchmarks import rehearse_build as build  # noqa: E402
from worldserve import envs  # noqa: E402

GIB = 1 << 30
PARTS = ("params", "single", "ranks", "reasoner", "plan")
DEFAULT_LAYOUTS = ("cfg=2,ulysses=4", "cfg=2,ring=4", "cfg=2,ulysses=4,shard=8")
PROMPT = "a robot arm stacks three red cubes on a wooden table, morning light"


def gib(num_bytes: float) -> float:
    return round(num_bytes / GIB, 3)


def parse_layout(spec: str) -> dict[str, int]:
    """"cfg=2,ulysses=4" -> {"cfg": 2, "ulysses": 4} (axes of stages.generation.parallel)."""
    out = {}
    for item in filter(None, spec.split(",")):
        axis, _, value = item.partition("=")
        if axis not in ("cfg", "ulysses", "ring", "shard"):
            raise SystemExit(f"--parallel: unknown axis {axis!r} (cfg, ulysses, ring, shard)")
        out[axis] = int(value)
    return out


def part_params(name: str) -> dict[str, Any]:
    fx = build.load_fixture(name)
    counts = build.count_params(fx)
    return {"part": "params", "model": name, "params": counts,
            "bf16_gib": {k: gib(v * build.BF16) for k, v in counts.items()},
            "published": {k: v for k, v in fx["published"].items() if not k.endswith("source")}}


def dev_dir() -> Path:
    """The dev Cosmos3 checkpoint (its tokenizer, scheduler and processor), built once."""
    global _DEV_DIR
    if _DEV_DIR is None:
        built = envs.dev_models_dir() / "generation"
        _DEV_DIR = built if built.is_dir() else harness.dev_model("generation", quiet=True)
    return _DEV_DIR


_DEV_DIR: Path | None = None


def new_mode() -> Any:
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True)


def prepared(name: str, frames: int, height: int, width: int) -> tuple[Any, Any, Any]:
    """(fake pipeline, its runner, a prepared request state) for one t2v request."""
    from worldserve.ipc.messages.generation import GenerationParams
    from worldserve.models.cosmos3.runner import Cosmos3Runner

    pipe = build.fake_pipeline(build.load_fixture(name), new_mode(),
                               dev_dir())
    runner = Cosmos3Runner(pipe, None)
    params = GenerationParams(prompt=PROMPT, width=width, height=height, num_frames=frames,
                              num_inference_steps=35, guidance_scale=6.0, seeds=[0])
    return pipe, runner, runner.prepare(["rehearsal"], [params], [0])


def request_shapes(state: Any) -> dict[str, Any]:
    row = state.rows[0]
    return {"latents": list(row.latents.shape), "sequence_length": row.cond["sequence_length"],
            "und_len": row.cond["und_len"], "uncond_und_len": row.uncond["und_len"],
            "vision_tokens": row.cond["num_vision_tokens"]}


def part_single(name: str, frames: int, height: int, width: int,
                decode: bool = True) -> dict[str, Any]:
    started = time.perf_counter()
    pipe, runner, state = prepared(name, frames, height, width)
    weights = build.pipeline_bytes(pipe)
    step = build.PeakTracker()
    step.external(pipe.transformer, pipe.vae)
    with step, build.DtypeChecks():
        runner.denoise_step(state)
    latents = state.rows[0].latents
    out = {"part": "single", "model": name, "request": f"{width}x{height}x{frames}, CFG",
           **request_shapes(state), "latents_after_step": str(latents.dtype),
           "weights_gib": gib(weights), "step_peak_gib": gib(step.peak)}
    if decode:
        vae = build.PeakTracker()
        vae.external(pipe.transformer, pipe.vae)
        with vae, build.DtypeChecks(), torch.no_grad():
            video = runner._vae_decode(runner._vae_latents(latents))
        out.update(video=list(video.shape), vae_decode_peak_gib=gib(vae.peak))
    out["estimate_gib"] = gib(weights + max(step.peak, out.get("vae_decode_peak_gib", 0) * GIB))
    out["wall_s"] = round(time.perf_counter() - started, 1)
    return out


def run_rank(pipe: Any, state: Any, layout: Any, rank: int, name: str) -> dict[str, Any]:
    """One rank of the group: its runner on the fake process group, one step, its figures."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from worldserve.levers.parallel.mesh import RankMesh
    from worldserve.levers.parallel.shard import ShardedBlocks
    from worldserve.models.cosmos3.parallel import ParallelCosmos3Runner

    dist.init_process_group("fake", rank=rank, world_size=layout.world_size, store=FakeStore())
    try:
        mesh = RankMesh(layout, rank)
        shards = None
        if layout.shard > 1:  # a fresh transformer: sharding replaces its block parameters
            mode = new_mode()
            with mode:
                pipe.transformer = build.build_transformer(build.load_fixture(name))
                shards = ShardedBlocks.from_module(list(pipe.transformer.layers), mesh.shard)
        runner = ParallelCosmos3Runner(pipe, None, mesh, shards)
        runner.connect_ranks(60.0)
        peak, sent = build.PeakTracker(), build.CollectiveCounter()
        if shards is not None:
            in_fake_mode(shards, mode)
        peak.external(pipe.transformer)
        with peak, sent, build.DtypeChecks():
            runner.denoise_step(state)
        return {"rank": rank, "coords": list(layout.coords(rank)),
                "weights_gib": gib(build.pipeline_bytes(pipe)),
                "step_peak_gib": gib(peak.peak), "sent_gib": gib(sent.bytes_sent),
                "collectives": {op: {"calls": v["calls"],
                                     "sent_mib": round(v["bytes_sent"] / 2**20, 1)}
                                for op, v in sent.ops.items()}}
    finally:
        dist.destroy_process_group()


def in_fake_mode(shards: Any, mode: Any, *inner: Any) -> None:
    """Each sharded block's gather / release under the fake mode (they point parameters at
    new tensors with `.data =`, which a fake tensor takes only inside its mode), with the
    measuring modes above it so that they still see the all-gathers."""
    def wrap(fn: Any) -> Any:
        def run() -> None:
            with contextlib.ExitStack() as stack:
                for m in (mode, *inner):
                    stack.enter_context(m)
                fn()
        return run

    for block in shards.blocks:  # the hooks look `gather` / `release` up at each call
        block.gather, block.release = wrap(block.gather), wrap(block.release)


def part_ranks(name: str, spec: str, frames: int, height: int, width: int,
               ranks: list[int] | None) -> dict[str, Any]:
    from worldserve.levers.parallel.mesh import ParallelLayout

    started = time.perf_counter()
    layout = ParallelLayout(**parse_layout(spec))
    pipe, _, state = prepared(name, frames, height, width)
    chosen = ranks if ranks is not None else list(range(layout.world_size))
    per_rank = [run_rank(pipe, copy.deepcopy(state), layout, r, name) for r in chosen]
    worst = max(per_rank, key=lambda r: r["weights_gib"] + r["step_peak_gib"])
    return {"part": "ranks", "model": name, "layout": layout.describe(),
            "request": f"{width}x{height}x{frames}, CFG", **request_shapes(state),
            "ranks": per_rank, "max_rank_estimate_gib": round(worst["weights_gib"]
                                                               + worst["step_peak_gib"], 3),
            "wall_s": round(time.perf_counter() - started, 1)}


def part_reasoner(name: str, prefill_tokens: int) -> dict[str, Any]:
    started = time.perf_counter()
    fx = build.load_fixture(name)
    mode = new_mode()
    with mode:
        model = build.build_reasoner(fx)
    out: dict[str, Any] = {"part": "reasoner", "model": name, "prefill_tokens": prefill_tokens}
    out["bf16"] = reasoner_pass(model, prefill_tokens)
    with mode:
        swapped = swap_w8a8(model)
    out["w8a8"] = {"fp8_linears": swapped, **reasoner_pass(model, prefill_tokens)}
    out["wall_s"] = round(time.perf_counter() - started, 1)
    return out


def reasoner_pass(model: Any, prefill_tokens: int) -> dict[str, Any]:
    """Prefill a chunk, then one static decode step, through worldserve's reasoner runner."""
    from worldserve.models.qwen_vl.processor import load_processor
    from worldserve.models.qwen_vl.runner import QwenVLRunner

    processor = load_processor(dev_dir())
    runner = QwenVLRunner(model, processor, "timestamped")
    path = runner.configure_decode(static=True)
    kv = runner.new_kv()
    prefill, decode = build.PeakTracker(), build.PeakTracker()
    prefill.external(model)
    with prefill, build.DtypeChecks():
        logits = runner.forward(kv, list(range(100, 100 + prefill_tokens)))
    kv_bytes = sum(t.nbytes for layer in kv.cache.layers for t in (layer._k, layer._v))
    decode.external(model)
    with decode, build.DtypeChecks():
        step = runner.forward(kv, [int(prefill_tokens % 1000) + 7])
    static_used = runner.static is not None and runner.static.fits([kv], 1)
    if path != "static" or not static_used:
        raise AssertionError(f"the decode step did not take the static path ({path})")
    return {"decode_path": path, "logits": list(logits.shape), "decode_logits": list(step.shape),
            "weights_gib": gib(build.tensor_bytes(model)), "kv_gib": gib(kv_bytes),
            "kv_bytes_per_token": kv_bytes // max(1, kv.cache.layers[0]._k.shape[2]),
            "prefill_peak_gib": gib(prefill.peak), "decode_peak_gib": gib(decode.peak)}


def swap_w8a8(model: Any) -> int:
    """Every LLM linear as an `Fp8Linear` with an FP8 weight (what the W8A8 reasoner load
    leaves: levers/fp8/load.py)."""
    from worldserve.levers.fp8.linear import swap_in_fp8_linears
    from worldserve.levers.fp8.weights import QuantLinear

    text = model.model.language_model
    linears = {f"model.language_model.{n}.": QuantLinear(
        weight=torch.empty(m.weight.shape, dtype=torch.float8_e4m3fn),
        weight_scale=torch.ones(()), input_scale=torch.ones(()))
        for n, m in text.named_modules() if type(m) is torch.nn.Linear}
    return swap_in_fp8_linears(model, linears, torch.bfloat16, "cpu")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=build.MODELS, default="nano")
    parser.add_argument("--parallel", default=None,
                        help="one layout, e.g. cfg=2,ulysses=4 [default: " +
                        "; ".join(DEFAULT_LAYOUTS) + "]")
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--frames", type=int, default=189)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--ranks", default=None, help="ranks to run, e.g. 0,7 [default: all]")
    parser.add_argument("--prefill-tokens", type=int, default=2048)
    parser.add_argument("--no-decode", action="store_true", help="skip the VAE decode")
    parser.add_argument("--gpu", choices=sorted(rehearse_plan.GPUS), default="h100")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    parts = args.parts.split(",")
    layouts = [args.parallel] if args.parallel else list(DEFAULT_LAYOUTS)
    ranks = [int(r) for r in args.ranks.split(",")] if args.ranks else None
    size = (args.frames, args.height, args.width)
    results: dict[str, Any] = {}
    if "params" in parts:
        harness.emit(part_params(args.model))
    if "single" in parts:
        results["single"] = part_single(args.model, *size, decode=not args.no_decode)
        harness.emit(results["single"])
    if "ranks" in parts:
        results["ranks"] = []
        for spec in layouts:
            results["ranks"].append(part_ranks(args.model, spec, *size, ranks))
            harness.emit(results["ranks"][-1])
    if "reasoner" in parts:
        results["reasoner"] = part_reasoner(args.model, args.prefill_tokens)
        harness.emit(results["reasoner"])
    if "plan" in parts:
        harness.emit(rehearse_plan.part_plan(args.model, layouts, args.gpu, results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
