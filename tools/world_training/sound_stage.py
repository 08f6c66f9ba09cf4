"""The generator's sound stage: teach the trained world transformer to make the tone of the colour.

After the world stage (train_world.py) the transformer draws the prompt's colour but its sound
tokens were never trained. This stage continues it on the flow loss of motion clips packed as a
video-with-sound request is served (`FlowLoss(sound_latents=...)`: the runner's `_prepare_row`
with `generate_sound`, the clip's sound latents from the trained sound tokenizer's encoder,
train_sound.py), mixed with images so the vision loss keeps pulling too. Only the generation
pathway trains: every transformer parameter the reasoner ties (its LLM is the transformer's
understanding pathway, `cosmos3_reasoner.loader.load_runner(generator=...)`) is frozen, so the
reasoner and a drafter trained against it stay valid; the stage asserts that every reasoner
tensor is bit-identical afterwards.

`retrain.py --sound FILE` runs it after the world stage. This command runs it alone on a weights
file already trained by the world stage (`--world`) and rewrites the shipped weights:

    python -m tools.world_training.train_sound --out /tmp/world-sound.safetensors
    python -m tools.world_training.sound_stage --world WORLD_FILE \\
        --sound /tmp/world-sound.safetensors
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tools.world_training.train_reasoner import lr_factor
from tools.world_training.train_sound import encode, padded_track
from tools.world_training.train_world import (
    WORLD,
    FlowLoss,
    flow_step,
    generation_params,
    generator_accuracy,
)
from worldserve.models.dev.world import trained
from worldserve.models.dev.world.evaluate import dominant_tone
from worldserve.models.dev.world.grammar import describe
from worldserve.models.dev.world.scenes import make_clip


@dataclass(frozen=True)
class SoundStageConfig:
    steps: int = 1200
    sound_batch_size: int = 4  # motion clips packed with sound (vision + sound loss)
    image_batch_size: int = 4  # images (vision loss), so image colour holds
    learning_rate: float = 1e-3
    weight_decay: float = 0.01
    uncond_rate: float = 0.1
    sigma_shift: float = 3.0
    num_eval: int = 20  # held-out prompts per kind
    eval_every: int = 300
    sample_steps: int = 12
    guidance_scale: float = 3.0
    seed: int = 0


def freeze_reasoner_pathway(transformer: Any, reasoner: Any) -> list[torch.nn.Parameter]:
    """Stop gradients into every transformer parameter the reasoner shares (tied: the same
    tensor); returns the generation pathway's parameters, the ones left to train."""
    tied = {id(p) for p in reasoner.parameters()}
    trainable = []
    for param in transformer.parameters():
        param.requires_grad_(id(param) not in tied)
        if param.requires_grad:
            trainable.append(param)
    if len(trainable) == len(list(transformer.parameters())):
        raise ValueError("the reasoner shares no parameter with the transformer: is it tied?")
    return trainable


@torch.no_grad()
def tone_accuracy(runner: Any, cfg: SoundStageConfig) -> float:
    """Held-out video-with-sound prompts sampled through the serving runner: the share whose
    sound reads as the prompt's colour."""
    hits = []
    runner.pipe.transformer.eval()
    for seed in range(cfg.num_eval):
        clip = make_clip(seed, "motion")
        params = generation_params(describe(clip.scene, "motion"), WORLD.num_frames,
                                   cfg.sample_steps, cfg.guidance_scale, seed, sound=True)
        _, extras = runner.run_to_end(params, seed)
        hits.append(dominant_tone(extras.audio, extras.sample_rate)[0] == clip.scene.colour)
    runner.pipe.transformer.train()
    return sum(hits) / len(hits)


def train_sound_stage(generator: Any, reasoner: Any, autoencoder: Any, cfg: SoundStageConfig,
                      log: Any = print) -> dict[str, Any]:
    """Train `generator`'s generation pathway in place; returns the stage's record."""
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng([17, cfg.seed])
    transformer = generator.pipe.transformer
    before = {k: v.detach().clone() for k, v in reasoner.model.state_dict().items()}
    params = freeze_reasoner_pathway(transformer, reasoner.model)
    flow = FlowLoss(generator, cfg, sound_latents=lambda clip: encode(
        autoencoder, padded_track(clip.sound)[None], sample=False)[0])
    optimiser = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda s: lr_factor(s, cfg.steps))
    transformer.train()
    history, start = [], time.process_time()
    for step in range(1, cfg.steps + 1):
        optimiser.zero_grad(set_to_none=True)
        # motion clips with their sound, then images
        loss = flow_step(flow, rng, [("motion", True)] * cfg.sound_batch_size
                         + [("image", False)] * cfg.image_batch_size)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimiser.step()
        schedule.step()
        if step % cfg.eval_every == 0 or step == cfg.steps:
            entry = {"step": step, "flow_loss": round(loss, 4),
                     "train_cpu_s": round(time.process_time() - start, 1),
                     "sound_tone": tone_accuracy(generator, cfg),
                     "generator": generator_accuracy(generator, cfg)}
            history.append(entry)
            log(entry)
    cpu_min = round((time.process_time() - start) / 60, 1)
    transformer.eval()
    for param in transformer.parameters():
        param.requires_grad_(True)
    assert_unchanged(before, reasoner.model.state_dict(), "the sound stage changed reasoner")
    return {"config": asdict(cfg), "cpu_min": cpu_min, "history": history,
            "frozen": "every transformer parameter the reasoner ties (bit-identical after)"}


def assert_unchanged(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor],
                     what: str) -> None:
    """Every tensor of `before` bit-identical in `after` (`what`: the error's subject)."""
    changed = [k for k, v in before.items() if not torch.equal(v, after[k])]
    if before.keys() != after.keys() or changed:
        raise AssertionError(f"{what} tensors: {changed[:5]}")


def build_world_dir(work: Path, weights: Path, autoencoder: Any) -> None:
    """A dev world directory from a weights file trained by the world stage (its transformer,
    VAE and reasoner tensors), with the trained sound tokenizer's decoder."""
    from worldserve.models.cosmos3.dev import build_pipeline, world_config
    from worldserve.models.cosmos3_reasoner.dev import write_reasoner_files
    from worldserve.models.dev import DEV_MODELS_SEED

    cfg = world_config()
    pipe = build_pipeline(DEV_MODELS_SEED, cfg)
    trained.apply_vision(pipe, *trained.read(weights))
    pipe.sound_tokenizer.decoder.load_state_dict(autoencoder.decoder.state_dict(), strict=True)
    pipe.save_pretrained(work)
    write_reasoner_files(work, DEV_MODELS_SEED, tokenizer_corpus=cfg.tokenizer_corpus)
    trained.apply_to_reasoner_files(work, weights)


def run(world: Path, sound: Path, cfg: SoundStageConfig, log: Any = print) -> dict[str, Any]:
    """Run the stage on `world`'s weights and write the shipped weights and manifest."""
    import tempfile

    from tools.world_training import train_sound
    from worldserve.models.cosmos3.runner import load_runner as load_generator
    from worldserve.models.cosmos3_reasoner.loader import load_runner as load_reasoner

    autoencoder, sound_record = train_sound.load(sound)
    tensors, metadata = trained.read(world)
    with tempfile.TemporaryDirectory(prefix="world-sound-") as scratch:
        work = Path(scratch) / "world"
        build_world_dir(work, world, autoencoder)
        generator = load_generator(work)
        reasoner = load_reasoner(work, generator=generator.pipe.transformer)
        record = train_sound_stage(generator, reasoner, autoencoder, cfg, log)
        transformer = generator.pipe.transformer.state_dict()
        tokenizer = generator.pipe.sound_tokenizer.state_dict()
    tensors = {k: v for k, v in tensors.items()
               if not k.startswith((trained.TRANSFORMER, trained.SOUND))}
    tensors.update({trained.TRANSFORMER + k: v for k, v in transformer.items()})
    tensors.update({trained.SOUND + k: v for k, v in tokenizer.items()})
    manifest = json.loads(trained.MANIFEST_PATH.read_text(encoding="utf-8"))
    manifest["made_by"] = [c for c in manifest["made_by"] if "sound" not in c] + [
        "python -m tools.world_training.train_sound",
        "python -m tools.world_training.sound_stage"]
    manifest["sound_tokenizer"] = sound_record
    manifest["sound_stage"] = record
    trained.write(tensors, metadata, manifest)
    return manifest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=Path, required=True,
                        help="a weights file the world stage wrote (no sound stage yet)")
    parser.add_argument("--sound", type=Path, required=True,
                        help="the sound tokenizer train_sound.py wrote (--out)")
    parser.add_argument("--steps", type=int, default=SoundStageConfig.steps)
    parser.add_argument("--eval-every", type=int, default=SoundStageConfig.eval_every)
    parser.add_argument("--lr", type=float, default=SoundStageConfig.learning_rate)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = SoundStageConfig(steps=args.steps, eval_every=args.eval_every,
                           learning_rate=args.lr)
    run(args.world, args.sound, cfg, lambda e: print(json.dumps(e), flush=True))
    print(f"wrote {trained.WEIGHTS_PATH} and {trained.MANIFEST_PATH}")


if __name__ == "__main__":
    main()
