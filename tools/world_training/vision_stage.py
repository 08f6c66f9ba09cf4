"""The reasoner's vision stage: train the reasoner's own tensors with its LLM frozen (issue 30).

The world checkpoint's reasoner answers colour and background but not shape or direction. Its
LLM is the generator transformer's understanding pathway (tied), so training it would change the
generator; its vision tower and mergers (`visual.*`, the weights file's `reasoner.*`) are its
own. This stage trains only those on the reasoner's answer loss as the world stage computes it
(motion-clip questions, train_reasoner.build_pool, and a share of live sessions), every
transformer parameter frozen, like prompt tuning through the vision tokens; it asserts every
transformer tensor bit-identical afterwards. `--min-pixels` upscales frames before patching
(train_reasoner.set_min_pixels): serving must then read the same setting from the world
directory's preprocessor config.

    python -m tools.world_training.vision_stage --steps 300 --eval-every 100 \\
        --out /tmp/world-vision.safetensors
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tools.world_training.sound_stage import assert_unchanged
from tools.world_training.train_reasoner import (
    WorldReasonerData,
    lr_factor,
    model_inputs,
    set_min_pixels,
)
from tools.world_training.train_world import reasoner_accuracy, reasoner_batch, reasoner_examples
from worldserve.models.dev.world import trained


@dataclass(frozen=True)
class VisionStageConfig:
    steps: int = 300
    reasoner_batch_size: int = 16
    learning_rate: float = 3e-3
    weight_decay: float = 0.01
    pool_clips: int = 2000
    stream_clips: int = 600
    stream_share: float = 0.25
    num_eval: int = 20  # live sessions; held-out clips x 2
    eval_every: int = 100
    min_pixels: int | None = None
    seed: int = 0


def freeze_transformer(transformer: Any, reasoner: Any) -> list[torch.nn.Parameter]:
    """Stop gradients into every transformer parameter (the tied LLM among them); returns the
    reasoner's own parameters (not the transformer's), the ones left to train."""
    held = {id(p) for p in transformer.parameters()}
    for param in transformer.parameters():
        param.requires_grad_(False)
    own = [p for p in reasoner.parameters() if id(p) not in held]
    for param in own:
        param.requires_grad_(True)
    if not own or len(own) == len(list(reasoner.parameters())):
        raise ValueError("the reasoner is not tied to the transformer")
    return own


def train_vision_stage(generator: Any, reasoner: Any, cfg: VisionStageConfig,
                       log: Any = print) -> dict[str, Any]:
    """Train `reasoner`'s own tensors in place; returns the stage's record."""
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng([19, cfg.seed])
    transformer = generator.pipe.transformer
    before = {k: v.detach().clone() for k, v in transformer.state_dict().items()}
    if cfg.min_pixels:
        set_min_pixels(reasoner, cfg.min_pixels)
    data = WorldReasonerData(reasoner)
    pool, streams = reasoner_examples(data, cfg)
    params = freeze_transformer(transformer, reasoner.model)
    optimiser = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda s: lr_factor(s, cfg.steps))
    history = [{"step": 0, **reasoner_accuracy(data, cfg.num_eval)}]
    log(history[0])
    reasoner.model.train()
    start = time.process_time()
    for step in range(1, cfg.steps + 1):
        optimiser.zero_grad(set_to_none=True)
        batch = reasoner_batch(pool, streams, cfg, rng)
        loss = reasoner.model(**model_inputs(reasoner, batch, with_labels=True)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimiser.step()
        schedule.step()
        if step % cfg.eval_every == 0 or step == cfg.steps:
            entry = {"step": step, "answer_loss": round(float(loss.detach()), 4),
                     "train_cpu_s": round(time.process_time() - start, 1),
                     **reasoner_accuracy(data, cfg.num_eval)}
            reasoner.model.train()
            history.append(entry)
            log(entry)
    reasoner.model.eval()
    for param in transformer.parameters():
        param.requires_grad_(True)
    assert_unchanged(before, transformer.state_dict(), "the vision stage changed transformer")
    return {"config": asdict(cfg), "cpu_min": round((time.process_time() - start) / 60, 1),
            "history": history, "trained": f"{len(params)} reasoner-only tensors",
            "frozen": "every transformer parameter (bit-identical after)"}


def run(weights: Path, out: Path, cfg: VisionStageConfig, log: Any = print) -> dict[str, Any]:
    """Run the stage on the world directory built from `weights`; write `weights` with the
    trained reasoner tensors to `out` (and its manifest beside it)."""
    from safetensors.torch import load_file

    from worldserve.models.cosmos3.dev import build_world
    from worldserve.models.cosmos3.runner import load_runner as load_generator
    from worldserve.models.cosmos3_reasoner.loader import load_runner as load_reasoner
    from worldserve.models.dev import DEV_MODELS_SEED

    tensors, metadata = trained.read(weights)
    own = trained.part(tensors, trained.REASONER)
    with tempfile.TemporaryDirectory(prefix="world-vision-") as scratch:
        work = Path(scratch) / "world"
        build_world(work, DEV_MODELS_SEED, weights)
        generator = load_generator(work)
        reasoner = load_reasoner(work, generator=generator.pipe.transformer)
        record = train_vision_stage(generator, reasoner, cfg, log)
        reasoner.model.save_pretrained(work / "trained-reasoner")
        built = load_file(str(work / trained.REASONER_WEIGHTS))
        after = load_file(str(work / "trained-reasoner" / trained.REASONER_WEIGHTS))
    changed = {k for k, v in after.items() if not torch.equal(v, built[k])}
    if not changed <= own.keys():
        outside = sorted(changed - own.keys())
        raise AssertionError(f"tensors outside the reasoner's own changed: {outside[:5]}")
    tensors.update({trained.REASONER + k: after[k] for k in own})
    source = Path(weights).with_suffix(".json")
    manifest = (json.loads(source.read_text(encoding="utf-8")) if source.is_file()
                else {"made_by": []})
    manifest["made_by"] = manifest["made_by"] + ["python -m tools.world_training.vision_stage"]
    manifest["vision_stage"] = record
    trained.write(tensors, metadata, manifest, out)
    return manifest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=Path, default=trained.WEIGHTS_PATH,
                        help="the weights file to start from (default: the shipped one)")
    parser.add_argument("--out", type=Path, required=True,
                        help="write the weights file here (with its manifest, .json)")
    parser.add_argument("--steps", type=int, default=VisionStageConfig.steps)
    parser.add_argument("--eval-every", type=int, default=VisionStageConfig.eval_every)
    parser.add_argument("--lr", type=float, default=VisionStageConfig.learning_rate)
    parser.add_argument("--min-pixels", type=int, default=None,
                        help="upscale frames to at least this many pixels (e.g. 16384)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if args.out.resolve() == trained.WEIGHTS_PATH.resolve():
        parser.error("--out is the shipped weights file: write elsewhere")
    torch.set_num_threads(args.threads)
    cfg = VisionStageConfig(steps=args.steps, eval_every=args.eval_every,
                            learning_rate=args.lr, min_pixels=args.min_pixels)
    run(args.world, args.out, cfg, lambda e: print(json.dumps(e), flush=True))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
