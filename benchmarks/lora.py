"""Cost of per-request LoRA in the generation engine, on the Wan dev checkpoint (or --model-path,
a Wan pipeline directory).

Runs the engine in this process (no server), `max_batch_size` 1 so every request is its own
batch and the engine interleaves them step by step, in three configurations of the same
--n requests:

  base         no adapter selected (the baseline);
  one_adapter  every request selects adapter `a` (LoRA layers in the forward, no switching);
  alternating  requests alternate between adapters `a` and `b`: the engine activates another
               selection before every step (the worst case of interleaving).

Also times POST-equivalent admin operations: a LoRA load and a weight update.

    .venv/bin/python benchmarks/lora.py [--n 4] [--size 64] [--steps 6]

Prints one JSON line at the end with the wall times and the ratios to the baseline.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402
from tests.unit.generation import admin_fixtures as fx  # noqa: E402
from worldserve.config import GenerationStageConfig, ServerConfig  # noqa: E402
from worldserve.engines.generation.engine import GenerationEngine  # noqa: E402
from worldserve.ipc.messages import (  # noqa: E402
    GenerateMedia,
    GenerationParams,
    LoraLoad,
    LoraRef,
    WeightsUpdate,
)


def run(engine: GenerationEngine, selections: list[list[LoraRef]], size: int,
        steps: int) -> float:
    """Wall seconds to finish one request per selection, all submitted at once."""
    done: list[object] = []
    started = time.perf_counter()
    for i, lora in enumerate(selections):
        params = GenerationParams(prompt=fx.PROMPT, width=size, height=size, num_frames=1,
                                  num_inference_steps=steps, guidance_scale=1.0, seeds=[i],
                                  max_sequence_length=32, lora=lora)
        msg = GenerateMedia(request_id=f"r{time.monotonic_ns()}-{i}", params=params,
                            output_stem=f"bench-{i}", output_format="png")
        engine.submit(msg, done.append)
    while engine.has_work():
        engine.step()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", type=Path, default=None)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model = args.model_path or harness.dev_model("wan")  # dev-models' generation/ is Cosmos3
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        lora_a = fx.build_lora(model, root / "a", 1, ["to_q", "to_k", "to_v", "to_out.0"])
        lora_b = fx.build_lora(model, root / "b", 2, ["to_q", "to_k", "to_v", "to_out.0"])
        updated = fx.build_updated_weights(model, root / "updated", 3)
        cfg = GenerationStageConfig(model_path=model, output_dir=root / "out", batch_wait_ms=0,
                                    max_batch_size=1, max_running_requests=args.n)
        engine = GenerationEngine(cfg, ServerConfig())
        while engine.has_work():
            engine.step()
        started = time.perf_counter()
        for name, path in (("a", lora_a), ("b", lora_b)):
            engine.submit(LoraLoad(request_id=f"load-{name}", name=name, path=str(path)),
                          lambda _: None)
        load_ms = harness.ms_since(started) / 2
        a, b = [LoraRef(name="a")], [LoraRef(name="b")]
        configs = {"base": [[]] * args.n, "one_adapter": [a] * args.n,
                   "alternating": [a if i % 2 == 0 else b for i in range(args.n)]}
        run(engine, configs["alternating"], args.size, args.steps)  # warm-up
        best = {name: min(run(engine, sel, args.size, args.steps) for _ in range(args.repeats))
                for name, sel in configs.items()}
        _, update_s = harness.timed(engine.submit, WeightsUpdate(request_id="w",
                                                                  path=str(updated)),
                                    lambda _: None)
        update_ms = update_s * 1000
    result = {
        "n": args.n, "size": args.size, "steps": args.steps,
        "base_s": round(best["base"], 4), "one_adapter_s": round(best["one_adapter"], 4),
        "alternating_s": round(best["alternating"], 4),
        "one_adapter_over_base": round(best["one_adapter"] / best["base"], 3),
        "alternating_over_one_adapter": round(best["alternating"] / best["one_adapter"], 3),
        "lora_load_ms": round(load_ms, 1), "weights_update_ms": round(update_ms, 1),
        "params": engine.num_params,
    }
    harness.emit(result)


if __name__ == "__main__":
    main()
