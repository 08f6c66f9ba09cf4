"""Train the dev Cosmos3 VAE (`AutoencoderKLWan`, the dev config's sizes) on the dev world.

The random dev VAE reconstructs worse than the mean image, so nothing a generator draws through
it could be read back. This trains it as a plain autoencoder (the posterior's mode, no sampling)
on world frames and clips in two phases: first a squared error that weighs the shape's pixels
5x the background's (a 20-28 px shape is a sixth of a 64x64 frame; unweighted, the mean
background wins first), then an absolute error plus the absolute error of the image's
horizontal and vertical differences, which sharpens the outlines the squared error leaves
blurred (a blurred square reads as a circle); both with a small L2 on the latents to keep their
scale bounded. Reconstructions are scored with the
world's own evaluator (colour, shape, background read from pixels), so "the latent carries the
scene" is a measured figure. The latents' per-channel mean and std over world frames become the
VAE's `latents_mean` / `latents_std`, which the pipeline uses to normalise them.

    python -m tools.world_training.train_vae --out /tmp/world-vae.safetensors

`--model realtime` trains the causal realtime model's Wan VAE (8x spatial, 4x temporal; the
realtime dev build's sizes) the same way, for `train_realtime`.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from worldserve.models.dev.world.evaluate import read_clip, read_frame
from worldserve.models.dev.world.scenes import make_clip

# Held-out clips use seeds below this; training clips draw from [TRAIN_SEED_BASE, 2x).
TRAIN_SEED_BASE = 1_000_000
SHAPE_WEIGHT = 5.0  # a shape pixel's squared error counts this many background pixels'
FOREGROUND_TOLERANCE = 0.1  # per-pixel distance (in [-1, 1] units) that marks a shape pixel


@dataclass(frozen=True)
class VaeTrainConfig:
    blur_steps: int = 2000  # phase 1: weighted squared error
    sharp_steps: int = 3000  # phase 2: weighted absolute error + edges
    batch_size: int = 16  # images per step
    video_every: int = 4  # every n-th step trains on motion clips instead of images...
    video_from_step: int = 0  # ...from this step on (0: from the start, as the shipped VAE
    # was trained). 3500 (images alone first) read shape 0.65 instead of 0.49 at step 5000,
    # colour and direction 1.00 both (11.7 CPU-min); the shipped world is not retrained on it yet
    video_batch_size: int = 2
    learning_rate: float = 3e-3
    sharp_learning_rate: float = 1e-3
    edge_weight: float = 2.0
    latent_l2: float = 1e-3
    num_eval: int = 100
    eval_every: int = 500
    seed: int = 0


def to_pixels(frames: np.ndarray) -> torch.Tensor:
    """(T, H, W, 3) uint8 -> (1, 3, T, H, W) in [-1, 1], the pipeline's VAE input."""
    return torch.from_numpy(frames).float().permute(3, 0, 1, 2)[None] / 127.5 - 1.0


def to_frames(pixels: torch.Tensor) -> np.ndarray:
    """(3, T, H, W) in [-1, 1] -> (T, H, W, 3) uint8."""
    frames = ((pixels.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return frames.permute(1, 2, 3, 0).numpy()


def weighted_error(reconstruction: torch.Tensor, target: torch.Tensor,
                   power: int) -> torch.Tensor:
    """|error| ** power with the shape's pixels (those away from the corner colour) weighted."""
    background = target[..., :1, :1]
    shape = ((target - background).abs().sum(1, keepdim=True) > FOREGROUND_TOLERANCE).float()
    return ((1 + (SHAPE_WEIGHT - 1) * shape) * (reconstruction - target).abs() ** power).mean()


def edge_error(reconstruction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Absolute error of the horizontal and vertical pixel differences."""
    return sum(((reconstruction.diff(dim=d) - target.diff(dim=d)).abs().mean()
                for d in (3, 4)), torch.zeros(()))


def vae_loss(vae: Any, pixels: torch.Tensor, sharp: bool, cfg: VaeTrainConfig) -> torch.Tensor:
    latents = vae.encode(pixels).latent_dist.mode()
    reconstruction = vae.decode(latents).sample
    loss = cfg.latent_l2 * (latents ** 2).mean()
    if not sharp:
        return loss + weighted_error(reconstruction, pixels, 2)
    return (loss + weighted_error(reconstruction, pixels, 1)
            + cfg.edge_weight * edge_error(reconstruction, pixels))


def reconstruct(vae: Any, pixels: torch.Tensor) -> torch.Tensor:
    latents = vae.encode(pixels).latent_dist.mode()
    return vae.decode(latents).sample


@torch.no_grad()
def reconstruction_accuracy(vae: Any, num_eval: int) -> dict[str, float]:
    """The evaluator's readings of reconstructed held-out images and clips."""
    vae.eval()
    hits: dict[str, list[bool]] = {k: [] for k in ("image_colour", "image_shape",
                                                    "image_background", "video_direction")}
    for seed in range(num_eval):
        clip = make_clip(seed, "image")
        reading = read_frame(to_frames(reconstruct(vae, to_pixels(clip.frames))[0])[0])
        hits["image_colour"].append(reading.colour == clip.scene.colour)
        hits["image_shape"].append(reading.shape == clip.scene.shape)
        hits["image_background"].append(reading.background == clip.scene.background)
    for seed in range(num_eval // 4):
        clip = make_clip(seed, "motion")
        reading = read_clip(to_frames(reconstruct(vae, to_pixels(clip.frames))[0]))
        hits["video_direction"].append(reading.direction == clip.scene.direction)
    vae.train()
    return {name: sum(v) / len(v) for name, v in hits.items()}


def _batch(rng: np.random.Generator, kind: str, size: int) -> torch.Tensor:
    seeds = rng.integers(TRAIN_SEED_BASE, 2 * TRAIN_SEED_BASE, size=size)
    return torch.cat([to_pixels(make_clip(int(s), kind).frames) for s in seeds])


def train_vae(vae: Any, cfg: VaeTrainConfig, log: Any = print) -> dict[str, Any]:
    """Train `vae` in place (both phases); returns the evaluation log."""
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng([7, cfg.seed])
    vae.train()
    optimiser = torch.optim.AdamW(vae.parameters(), lr=cfg.learning_rate, weight_decay=0.0)
    history, start = [], time.process_time()
    num_steps = cfg.blur_steps + cfg.sharp_steps
    for step in range(1, num_steps + 1):
        sharp = step > cfg.blur_steps
        if step == cfg.blur_steps + 1:
            optimiser = torch.optim.AdamW(vae.parameters(), lr=cfg.sharp_learning_rate,
                                          weight_decay=0.0)
        video = (cfg.video_every > 0 and step >= cfg.video_from_step
                 and step % cfg.video_every == 0)
        pixels = (_batch(rng, "motion", cfg.video_batch_size) if video
                  else _batch(rng, "image", cfg.batch_size))
        loss = vae_loss(vae, pixels, sharp, cfg)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        optimiser.step()
        if step % cfg.eval_every == 0 or step == num_steps:
            entry = {"step": step, "loss": round(float(loss.detach()), 4),
                     "train_cpu_s": round(time.process_time() - start, 1),
                     "accuracy": reconstruction_accuracy(vae, cfg.num_eval)}
            history.append(entry)
            log(entry)
    vae.eval()
    return {"history": history}


@torch.no_grad()
def latent_statistics(vae: Any, num_clips: int = 256) -> tuple[list[float], list[float]]:
    """Per-channel mean and std of the latents of world images and clips (the VAE's
    `latents_mean` / `latents_std`: the pipeline normalises latents with them)."""
    latents = []
    for index in range(num_clips):
        kind = "image" if index % 2 else "motion"
        clip = make_clip(3 * TRAIN_SEED_BASE + index, kind)
        latents.append(vae.encode(to_pixels(clip.frames)).latent_dist.mode().flatten(2))
    stacked = torch.cat(latents, dim=2)[0]
    return stacked.mean(1).tolist(), stacked.std(1).clamp_min(1e-3).tolist()


def seeded_vae(model: str) -> Any:
    """The dev build's seeded VAE of `model` ("cosmos3" or "realtime"), the training's start."""
    from worldserve.models.dev.seeding import seeded

    if model == "realtime":
        from worldserve.models.causal_dit.dev import WAN_CONFIG
        from worldserve.models.wan.dev import build_vae as build_wan_vae

        with seeded(0, "realtime.vae"):
            return build_wan_vae(WAN_CONFIG)
    from worldserve.models.cosmos3.dev import Cosmos3DevConfig, build_vae

    with seeded(0, "cosmos3.vae"):
        return build_vae(Cosmos3DevConfig())


def main(argv: list[str] | None = None) -> None:
    from safetensors.torch import save_file

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blur-steps", type=int, default=VaeTrainConfig.blur_steps)
    parser.add_argument("--sharp-steps", type=int, default=VaeTrainConfig.sharp_steps)
    parser.add_argument("--video-from-step", type=int, default=VaeTrainConfig.video_from_step)
    parser.add_argument("--eval-every", type=int, default=VaeTrainConfig.eval_every)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", choices=("cosmos3", "realtime"), default="cosmos3")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    vae = seeded_vae(args.model)
    log = lambda entry: print(json.dumps(entry), flush=True)  # noqa: E731
    cfg = VaeTrainConfig(blur_steps=args.blur_steps, sharp_steps=args.sharp_steps,
                         video_from_step=args.video_from_step, eval_every=args.eval_every)
    start = time.process_time()
    history = train_vae(vae, cfg, log)["history"]
    mean, std = latent_statistics(vae)
    log({"latents_mean": mean, "latents_std": std})
    record = {"config": asdict(cfg), "model": args.model, "threads": args.threads,
              "history": history,
              "cpu_min": round((time.process_time() - start) / 60, 1)}
    save_file({k: v.contiguous() for k, v in vae.state_dict().items()}, args.out,
              metadata={"latents_mean": json.dumps(mean), "latents_std": json.dumps(std),
                        "training": json.dumps(record)})


if __name__ == "__main__":
    main()
