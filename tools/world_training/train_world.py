"""Train the dev Cosmos3 directory on the dev world: the generator and its reasoner together.

One Cosmos3 checkpoint both generates and reasons, and the reasoner's LLM *is* the generator
transformer's understanding pathway (model-families.md 2.4; colocation ties them into one set of
parameters and refuses a directory where they differ). So both stages train at once, tied the
way serving ties them (`cosmos3_reasoner.loader.load_runner(generator=...)`): each step adds the
generator's flow-matching loss on world images and clips (through the serving path's own prompt
packing, `Cosmos3Prepare._prepare_row`) to the reasoner's answer loss (train_reasoner.py), and
one optimiser updates the union of their parameters. The VAE is trained first (train_vae.py)
and frozen here.

Flow matching as the pipeline samples it: x_t = (1 - sigma) x0 + sigma noise, the transformer
predicts noise - x0 at timestep 1000 sigma (UniPC `flow_prediction`), sigma drawn
logit-normal and shifted toward noise like the sampler's `flow_shift`; one prompt in ten is
replaced by the unconditional (negative) prompt so classifier-free guidance has something to
subtract.

    python -m tools.world_training.train_world --model-dir DIR --steps 2000
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from tools.world_training.train_reasoner import (
    TrainConfig,
    WorldReasonerData,
    build_pool,
    exact_accuracy,
    lr_factor,
    model_inputs,
)
from tools.world_training.train_vae import TRAIN_SEED_BASE, to_pixels
from worldserve.models.dev.world.evaluate import read_clip, read_frame
from worldserve.models.dev.world.grammar import describe
from worldserve.models.dev.world.scenes import WorldConfig, make_clip

WORLD = WorldConfig()


@dataclass(frozen=True)
class WorldTrainConfig:
    steps: int = 2400
    image_batch_size: int = 12  # generator samples per step (one packed forward each)
    video_batch_size: int = 4
    reasoner_batch_size: int = 16
    learning_rate: float = 2e-3
    weight_decay: float = 0.01
    uncond_rate: float = 0.1
    sigma_shift: float = 3.0
    pool_clips: int = 2000
    stream_clips: int = 600  # live-session examples (every frame's colour, one turn each)
    stream_share: float = 0.25  # of each reasoner batch
    num_eval: int = 20  # generator prompts per kind; the reasoner's held-out clips x 2
    eval_every: int = 600
    sample_steps: int = 12
    guidance_scale: float = 3.0
    seed: int = 0


def generation_params(prompt: str, num_frames: int, steps: int, guidance: float,
                      seed: int = 0, sound: bool = False) -> Any:
    from worldserve.ipc.messages.generation import GenerationParams

    return GenerationParams(prompt=prompt, width=WORLD.width_px, height=WORLD.height_px,
                            num_frames=num_frames, num_inference_steps=steps,
                            guidance_scale=guidance, seeds=[seed], fps=WORLD.fps,
                            generate_sound=sound)


class FlowLoss:
    """The generator's training loss on one world clip, packed as serving packs its prompt.

    `sound_latents` (clip -> its clean sound latents, (sound_dim, T)): when given, a call with
    `sound=True` packs the clip as a video-with-sound request (`generate_sound`) and adds the
    sound tokens' flow loss at the same sigma, as the sampler steps both at one timestep."""

    def __init__(self, runner: Any, cfg: Any, sound_latents: Any = None) -> None:
        self.runner = runner
        self.cfg = cfg
        self.sound_latents = sound_latents
        self.rows: dict[tuple[str, int, bool], Any] = {}  # (prompt, frames, sound) -> row

    def row(self, prompt: str, num_frames: int, sound: bool = False) -> Any:
        key = (prompt, num_frames, sound)
        if key not in self.rows:
            params = generation_params(prompt, num_frames, 2, self.cfg.guidance_scale,
                                       sound=sound)
            self.rows[key] = self.runner._prepare_row(params, 0)
        return self.rows[key]

    def __call__(self, clip: Any, rng: np.random.Generator, sound: bool = False) -> torch.Tensor:
        pipe = self.runner.pipe
        row = self.row(describe(clip.scene, clip.kind), len(clip.frames), sound)
        packed = row.uncond if rng.random() < self.cfg.uncond_rate else row.cond
        with torch.no_grad():
            clean = pipe._encode_video(to_pixels(clip.frames))[0]
        u = 1.0 / (1.0 + math.exp(-rng.normal()))
        sigma = self.cfg.sigma_shift * u / (1 + (self.cfg.sigma_shift - 1) * u)
        noise = torch.randn_like(clean)
        noisy = (1 - sigma) * clean + sigma * noise
        sound_kwargs, sound_target = (self._sound_inputs(clip, packed, sigma) if sound
                                      else ({}, None))
        preds = pipe.transformer(**vision_inputs(packed, noisy, sigma), return_dict=False,
                                 **sound_kwargs)
        velocity = preds[0][0].reshape(clean.shape)
        loss = ((velocity - (noise - clean)) ** 2).mean()
        if sound_target is not None:
            loss = loss + ((preds[1][0].reshape(sound_target.shape) - sound_target) ** 2).mean()
        return loss

    def _sound_inputs(self, clip: Any, packed: dict[str, Any],
                      sigma: float) -> tuple[dict[str, Any], torch.Tensor]:
        """The transformer's sound arguments for the clip's noised sound latents, and the
        velocity they should predict (noise - clean)."""
        with torch.no_grad():
            clean = self.sound_latents(clip)
        noise = torch.randn_like(clean)
        kwargs = {"sound_tokens": [(1 - sigma) * clean + sigma * noise],
                  "sound_timesteps": torch.full((packed["sound_len"],), sigma * 1000.0)}
        kwargs.update({name: packed[name] for name in (
            "sound_token_shapes", "sound_sequence_indexes", "sound_mse_loss_indexes",
            "sound_noisy_frame_indexes")})
        return kwargs, noise - clean


def vision_inputs(packed: dict[str, Any], noisy: torch.Tensor, sigma: float) -> dict[str, Any]:
    """The transformer's text and vision arguments for a packed row whose noisy vision latents
    are `noisy`, every noisy token at timestep 1000 sigma (shared by the training stages)."""
    names = ("input_ids", "text_indexes", "position_ids", "und_len", "sequence_length",
             "vision_token_shapes", "vision_sequence_indexes", "vision_mse_loss_indexes",
             "vision_noisy_frame_indexes")
    return {**{name: packed[name] for name in names}, "vision_tokens": [noisy],
            "vision_timesteps": torch.full((packed["num_noisy_vision_tokens"],), sigma * 1000.0)}


@torch.no_grad()
def generator_accuracy(runner: Any, cfg: WorldTrainConfig) -> dict[str, float]:
    """The evaluator's readings of images and videos sampled through the serving runner."""
    hits: dict[str, list[bool]] = {k: [] for k in ("image_colour", "image_shape",
                                                    "video_colour", "video_direction")}
    runner.pipe.transformer.eval()
    for seed in range(cfg.num_eval):
        clip = make_clip(seed, "image")
        params = generation_params(describe(clip.scene, "image"), 1, cfg.sample_steps,
                                   cfg.guidance_scale, seed)
        frames, _ = runner.run_to_end(params, seed)
        reading = read_frame(_uint8(frames[0]))
        hits["image_colour"].append(reading.colour == clip.scene.colour)
        hits["image_shape"].append(reading.shape == clip.scene.shape)
        clip = make_clip(seed, "motion")
        params = generation_params(describe(clip.scene, "motion"), WORLD.num_frames,
                                   cfg.sample_steps, cfg.guidance_scale, seed)
        frames, _ = runner.run_to_end(params, seed)
        video = read_clip(np.stack([_uint8(f) for f in frames]))
        hits["video_colour"].append(video.colour == clip.scene.colour)
        hits["video_direction"].append(video.direction == clip.scene.direction)
    runner.pipe.transformer.train()
    return {name: sum(v) / len(v) for name, v in hits.items()}


@torch.no_grad()
def stream_accuracy(data: WorldReasonerData, num_eval: int) -> float:
    """Held-out live sessions, teacher-forced: the share of frames whose reply (every token
    and the end of turn) is the model's greedy choice. The served figure is quality.py's."""
    hits = []
    for seed in range(num_eval):
        example = data.stream_example(make_clip(seed, "stream"), WORLD.num_frames)
        inputs = model_inputs(data.runner, [example], with_labels=False)
        greedy = data.runner.model(**inputs).logits[0].argmax(-1)
        ids = torch.tensor(example.ids)
        for start, end in example.answer_spans or ():
            hits.append(bool((greedy[start - 1:end - 1] == ids[start:end]).all()))
    return sum(hits) / len(hits)


def train_world(generator: Any, reasoner: Any, cfg: WorldTrainConfig,
                log: Any = print) -> dict[str, Any]:
    """Train both stages in place (`reasoner` tied to `generator`'s transformer)."""
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng([11, cfg.seed])
    flow = FlowLoss(generator, cfg)
    data = WorldReasonerData(reasoner)
    pool, streams = reasoner_examples(data, cfg)
    params = _unique_parameters(generator.pipe.transformer, reasoner.model)
    optimiser = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda s: lr_factor(s, cfg.steps))
    generator.pipe.transformer.train()
    reasoner.model.train()
    history, start = [], time.process_time()
    for step in range(1, cfg.steps + 1):
        optimiser.zero_grad(set_to_none=True)
        flow_loss = flow_step(flow, rng, [("image", False)] * cfg.image_batch_size
                              + [("motion", False)] * cfg.video_batch_size)
        batch = reasoner_batch(pool, streams, cfg, rng)
        answer_loss = reasoner.model(**model_inputs(reasoner, batch, with_labels=True)).loss
        answer_loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimiser.step()
        schedule.step()
        if step % cfg.eval_every == 0 or step == cfg.steps:
            reasoner.model.eval()
            entry = {"step": step, "flow_loss": round(flow_loss, 4),
                     "answer_loss": round(float(answer_loss.detach()), 4),
                     "train_cpu_s": round(time.process_time() - start, 1),
                     "generator": generator_accuracy(generator, cfg),
                     **reasoner_accuracy(data, cfg.num_eval)}
            reasoner.model.train()
            history.append(entry)
            log(entry)
    generator.pipe.transformer.eval()
    reasoner.model.eval()
    return {"config": asdict(cfg), "history": history}


def reasoner_examples(data: WorldReasonerData, cfg: Any) -> tuple[list[Any], list[Any]]:
    """The reasoner's training examples: `cfg.pool_clips` motion clips with every question
    (train_reasoner.build_pool) and `cfg.stream_clips` live sessions of stream clips."""
    pool = build_pool(data, TrainConfig(pool_clips=cfg.pool_clips, seed=cfg.seed))
    streams = [data.stream_example(make_clip(TRAIN_SEED_BASE + index, "stream"),
                                   WORLD.num_frames) for index in range(cfg.stream_clips)]
    return pool, streams


def reasoner_batch(pool: list[Any], streams: list[Any], cfg: Any,
                   rng: np.random.Generator) -> list[Any]:
    """One reasoner batch: `cfg.reasoner_batch_size` examples, a `cfg.stream_share` of them
    live sessions, drawn with replacement."""
    num_stream = round(cfg.reasoner_batch_size * cfg.stream_share) if streams else 0
    return ([pool[int(i)] for i in rng.integers(len(pool),
                                                size=cfg.reasoner_batch_size - num_stream)]
            + [streams[int(i)] for i in rng.integers(len(streams), size=num_stream)])


def reasoner_accuracy(data: WorldReasonerData, num_eval: int) -> dict[str, Any]:
    """The reasoner's held-out figures: exact answers on `2 num_eval` clips per question kind
    and the live-session replies of `num_eval` sessions."""
    return {"reasoner": exact_accuracy(data, num_eval * 2),
            "stream_replies": stream_accuracy(data, num_eval)}


def flow_step(flow: FlowLoss, rng: np.random.Generator, batch: list[tuple[str, bool]]) -> float:
    """Back-propagate the flow loss of one batch, (clip kind, with sound) per sample, each on
    a fresh training clip drawn in order; returns the batch's loss."""
    total = 0.0
    for kind, sound in batch:
        clip = make_clip(int(rng.integers(TRAIN_SEED_BASE, 2 * TRAIN_SEED_BASE)), kind)
        loss = flow(clip, rng, sound=sound) / len(batch)
        loss.backward()
        total += float(loss.detach())
    return total


def _unique_parameters(*modules: Any) -> list[torch.nn.Parameter]:
    seen: set[int] = set()
    unique = []
    for module in modules:
        for param in module.parameters():
            if id(param) not in seen and param.requires_grad:
                seen.add(id(param))
                unique.append(param)
    return unique


def _uint8(frame: np.ndarray) -> np.ndarray:
    return (np.clip(frame, 0.0, 1.0) * 255).round().astype(np.uint8)


def main(argv: list[str] | None = None) -> None:
    import argparse
    from pathlib import Path

    from worldserve.models.cosmos3.runner import load_runner as load_generator
    from worldserve.models.cosmos3_reasoner.loader import load_runner as load_reasoner

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, required=True,
                        help="a dev Cosmos3 directory whose VAE is already trained")
    parser.add_argument("--steps", type=int, default=WorldTrainConfig.steps)
    parser.add_argument("--eval-every", type=int, default=WorldTrainConfig.eval_every)
    parser.add_argument("--lr", type=float, default=WorldTrainConfig.learning_rate)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True, help="save both stages here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    generator = load_generator(args.model_dir)
    reasoner = load_reasoner(args.model_dir, generator=generator.pipe.transformer)
    log = lambda entry: print(json.dumps(entry), flush=True)  # noqa: E731
    cfg = WorldTrainConfig(steps=args.steps, eval_every=args.eval_every,
                           learning_rate=args.lr)
    train_world(generator, reasoner, cfg, log)
    generator.pipe.transformer.save_pretrained(args.out / "transformer")
    reasoner.model.save_pretrained(args.out / "reasoner")


if __name__ == "__main__":
    main()
