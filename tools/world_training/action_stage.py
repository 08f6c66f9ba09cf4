"""The generator's action stage: teach the trained world transformer what the agent's keys mean.

The world and sound stages never showed the transformer an action token, so its action heads
are random and an action request's keys carry no meaning. This stage continues it on world
agent clips (`make_clip(seed, "agent")`, keys -> 9-D camera_pose deltas by the realtime
world's own `pose_deltas`), each packed exactly as the actions route packs a request (the
runner's `_prepare_row` with a `camera_pose` `ActionCondition` at tier 256), with the flow loss
on what each mode generates:

- forward dynamics: the first latent frame and every action clean, the later frames noisy;
- inverse dynamics: every latent frame clean, the actions noisy;
- policy: the first latent frame clean, the later frames and the actions noisy.

Only the generation pathway and the action heads train: every transformer parameter the
reasoner ties is frozen and asserted bit-identical afterwards (sound_stage.py). Held-out
figures go through the serving runner (`run_to_end`, as the actions route runs a request):
forward dynamics by the evaluator's action response (the agent's net move equals the roll-out
of the keys), inverse dynamics by each predicted pose delta read back as a screen step
(`agent.screen_step_of_pose`) against the clip's keys.

It never writes the shipped weights: the trained transformer goes to `--out`.

    python -m tools.world_training.action_stage --out /work/runs/actions/world-actions.safetensors
"""

from __future__ import annotations

import argparse
import io
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from tools.world_training.sound_stage import assert_unchanged, freeze_reasoner_pathway
from tools.world_training.train_reasoner import lr_factor
from tools.world_training.train_vae import TRAIN_SEED_BASE
from tools.world_training.train_world import WORLD, _uint8, vision_inputs
from worldserve.models.cosmos3.world import DOMAIN, pose_deltas
from worldserve.models.dev.world.agent import screen_step, screen_step_of_pose
from worldserve.models.dev.world.evaluate import action_response
from worldserve.models.dev.world.grammar import describe
from worldserve.models.dev.world.render import png_bytes
from worldserve.models.dev.world.scenes import make_clip

MODES = ("forward_dynamics", "inverse_dynamics", "policy")
TIER = 256  # the smallest action canvas: a 64x64 world frame is padded, never scaled


@dataclass(frozen=True)
class ActionStageConfig:
    steps: int = 1500
    batch_size: int = 3  # agent clips per step, the modes in turn
    pool_clips: int = 256  # training clips encoded once (a 256-px canvas costs 0.5 CPU-s)
    learning_rate: float = 2e-3
    weight_decay: float = 0.01
    uncond_rate: float = 0.1
    sigma_shift: float = 3.0
    # Inverse dynamics' sigma (only the actions are noisy) unshifted: a step is a 0.05-unit
    # delta under unit noise, resolved in the last, low-sigma steps, which a shift of 3 rarely
    # draws (a first run with 3 left inverse dynamics at chance).
    action_sigma_shift: float = 1.0
    num_eval: int = 20  # held-out clips per mode
    eval_every: int = 300
    sample_steps: int = 12
    guidance_scale: float = 3.0
    seed: int = 0


def action_params(clip: Any, mode: str, steps: int, guidance: float, seed: int = 0) -> Any:
    """The GenerationParams the actions route makes for this clip: its first frame (policy,
    forward dynamics: PNG) or the whole clip (inverse dynamics: MP4), the keys as pose deltas
    (forward dynamics)."""
    from worldserve.ipc.messages.generation import ActionCondition, GenerationParams

    chunk = len(clip.frames) - 1
    raw = (pose_deltas(clip.keys_per_step, chunk).tolist() if mode == "forward_dynamics"
           else None)
    action = ActionCondition(mode=mode, chunk_size=chunk, domain_name=DOMAIN,
                             resolution_tier=TIER, raw_actions=raw)
    media: dict[str, Any] = ({"condition_video": _mp4(clip.frames)} if mode == "inverse_dynamics"
                             else {"condition_images": [png_bytes(clip.frames[0])]})
    return GenerationParams(prompt=describe(clip.scene, "agent"), width=WORLD.width_px,
                            height=WORLD.height_px, num_frames=len(clip.frames),
                            num_inference_steps=steps, guidance_scale=guidance, seeds=[seed],
                            fps=WORLD.fps, action=action, **media)


class ActionFlowLoss:
    """The flow loss of one agent clip in one action mode, on the row serving would pack."""

    def __init__(self, runner: Any, cfg: ActionStageConfig) -> None:
        self.runner = runner
        self.cfg = cfg
        self.rows: dict[tuple[str, str], Any] = {}  # (prompt, mode) -> RowState

    def row(self, clip: Any, mode: str) -> Any:
        """The packed row: its layout depends on the prompt and the mode, not on the pixels."""
        key = (describe(clip.scene, "agent"), mode)
        if key not in self.rows:
            params = action_params(clip, mode, 2, self.cfg.guidance_scale)
            self.rows[key] = self.runner._prepare_row(params, 0)
        return self.rows[key]

    def __call__(self, clip: Any, mode: str, rng: np.random.Generator,
                 clean: torch.Tensor | None = None) -> torch.Tensor:
        """`clean`: the clip's `clean_latents`, when already encoded."""
        row = self.row(clip, mode)
        packed = row.uncond if rng.random() < self.cfg.uncond_rate else row.cond
        if clean is None:
            with torch.no_grad():
                clean = clean_latents(self.runner.pipe, clip.frames)
        actions = padded_actions(clip, row.action_latents.shape[-1])
        shift = (self.cfg.action_sigma_shift if mode == "inverse_dynamics"
                 else self.cfg.sigma_shift)
        u = 1.0 / (1.0 + math.exp(-rng.normal()))
        sigma = shift * u / (1 + (shift - 1) * u)
        vision_noise, action_noise = torch.randn_like(clean), torch.randn_like(actions)
        vision_keep = row.vision_mask.to(clean.dtype)  # (T, 1, 1): 1 where a frame is given
        action_keep = row.action_mask.to(actions.dtype)  # (chunk, 1)
        noisy_vision = _noised(clean, vision_noise, vision_keep, sigma)
        noisy_actions = _noised(actions, action_noise, action_keep, sigma)
        noisy_actions[:, row.raw_action_dim:] = 0  # as the sampler keeps the padding
        preds = self.runner.pipe.transformer(
            **vision_inputs(packed, noisy_vision, sigma),
            action_tokens=[noisy_actions], action_token_shapes=packed["action_token_shapes"],
            action_sequence_indexes=packed["action_sequence_indexes"],
            action_mse_loss_indexes=packed["action_mse_loss_indexes"],
            action_timesteps=torch.full((packed["num_noisy_action_tokens"],), sigma * 1000.0),
            action_noisy_frame_indexes=packed["action_noisy_frame_indexes"],
            action_domain_ids=[row.action_domain_id], return_dict=False)
        loss = _masked_mse(preds[0][0].reshape(clean.shape), vision_noise - clean,
                           1 - vision_keep)
        raw = row.raw_action_dim
        return loss + _masked_mse(preds[2][0][:, :raw], (action_noise - actions)[:, :raw],
                                  1 - action_keep)


def clean_latents(pipe: Any, frames: np.ndarray) -> torch.Tensor:
    """The clip's vision latents as `prepare_latents` encodes an action clip: padded into the
    tier's canvas, encoded, the padding's latents cropped."""
    clip = [Image.fromarray(frame) for frame in frames]
    pixels, size, _, _ = pipe._prepare_action_video_conditioning(
        clip, TIER, len(frames), device="cpu", dtype=torch.float32)
    latents = pipe._encode_video(pixels).contiguous().float()
    return pipe._remove_action_video_padding_from_latent(latents, size)[0]


def padded_actions(clip: Any, action_dim: int) -> torch.Tensor:
    """The clip's keys as pose deltas, zero-padded to the action head's width."""
    poses = pose_deltas(clip.keys_per_step, len(clip.frames) - 1)
    return torch.nn.functional.pad(poses, (0, action_dim - poses.shape[-1]))


def _noised(clean: torch.Tensor, noise: torch.Tensor, keep: torch.Tensor,
            sigma: float) -> torch.Tensor:
    return keep * clean + (1 - keep) * ((1 - sigma) * clean + sigma * noise)


def _masked_mse(pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The mean squared error over the generated (noisy) positions only; 0 when there are none."""
    weight = weight.expand_as(pred)
    if float(weight.sum()) == 0:
        return pred.sum() * 0.0
    return (((pred - target) ** 2) * weight).sum() / weight.sum()


@torch.no_grad()
def action_accuracy(runner: Any, cfg: ActionStageConfig) -> dict[str, float]:
    """Held-out agent clips through the serving runner: forward dynamics' action response and
    inverse dynamics' per-step key accuracy (a step: the predicted delta read as a screen step
    equals the held keys' step)."""
    response, steps_hit = [], []
    runner.pipe.transformer.eval()
    for seed in range(cfg.num_eval):
        clip = make_clip(seed, "agent")
        params = action_params(clip, "forward_dynamics", cfg.sample_steps, cfg.guidance_scale,
                               seed)
        frames, _ = runner.run_to_end(params, seed)
        video = np.stack([_uint8(f) for f in frames])
        response.append(action_response(video, clip.keys_per_step, WORLD.step_px))
        params = action_params(clip, "inverse_dynamics", cfg.sample_steps, cfg.guidance_scale,
                               seed)
        _, extras = runner.run_to_end(params, seed)
        steps_hit += [screen_step_of_pose(pose) == screen_step(keys)
                      for pose, keys in zip(extras.action, clip.keys_per_step)]
    runner.pipe.transformer.train()
    return {"forward_response": sum(response) / len(response),
            "inverse_step_keys": sum(steps_hit) / len(steps_hit)}


def train_action_stage(generator: Any, reasoner: Any, cfg: ActionStageConfig,
                       log: Any = print) -> dict[str, Any]:
    """Train `generator`'s generation pathway and action heads in place; returns the record."""
    start = time.process_time()  # the stage's CPU time, pool and evaluations included
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng([23, cfg.seed])
    transformer = generator.pipe.transformer
    before = {k: v.detach().clone() for k, v in reasoner.model.state_dict().items()}
    params = freeze_reasoner_pathway(transformer, reasoner.model)
    flow = ActionFlowLoss(generator, cfg)
    pool = training_pool(generator.pipe, cfg.pool_clips)
    optimiser = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda s: lr_factor(s, cfg.steps))
    history = [{"step": 0, **action_accuracy(generator, cfg)}] if cfg.eval_every else []
    for entry in history:
        log(entry)
    transformer.train()
    for step in range(1, cfg.steps + 1):
        optimiser.zero_grad(set_to_none=True)
        total = 0.0
        for index in range(cfg.batch_size):
            clip, clean = pool[int(rng.integers(len(pool)))]
            loss = flow(clip, MODES[(step + index) % len(MODES)], rng, clean) / cfg.batch_size
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimiser.step()
        schedule.step()
        if cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.steps):
            entry = {"step": step, "flow_loss": round(total, 4),
                     "train_cpu_s": round(time.process_time() - start, 1),
                     **action_accuracy(generator, cfg)}
            history.append(entry)
            log(entry)
    transformer.eval()
    for param in transformer.parameters():
        param.requires_grad_(True)
    assert_unchanged(before, reasoner.model.state_dict(), "the action stage changed reasoner")
    return {"config": asdict(cfg), "cpu_min": round((time.process_time() - start) / 60, 1),
            "history": history,
            "frozen": "every transformer parameter the reasoner ties (bit-identical after)"}


@torch.no_grad()
def training_pool(pipe: Any, num_clips: int) -> list[tuple[Any, torch.Tensor]]:
    """Training agent clips (seeds from TRAIN_SEED_BASE, disjoint from the held-out 0..) with
    their clean latents."""
    clips = [make_clip(TRAIN_SEED_BASE + index, "agent") for index in range(num_clips)]
    return [(clip, clean_latents(pipe, clip.frames)) for clip in clips]


def _mp4(frames: np.ndarray) -> bytes:
    from worldserve.media.video import encode_mp4

    out = io.BytesIO()
    encode_mp4(np.asarray(frames), int(WORLD.fps), out)
    return out.getvalue()


def run(work: Path, out: Path, cfg: ActionStageConfig, log: Any = print) -> dict[str, Any]:
    """Build the shipped world directory under `work`, train it, and write its transformer (the
    trained-weights prefix) and the record to `out` (never the shipped weights)."""
    from safetensors.torch import save_file

    from worldserve.models.cosmos3.dev import build_world
    from worldserve.models.cosmos3.runner import load_runner as load_generator
    from worldserve.models.cosmos3_reasoner.loader import load_runner as load_reasoner
    from worldserve.models.dev import DEV_MODELS_SEED
    from worldserve.models.dev.world import trained

    build_world(work, DEV_MODELS_SEED)
    generator = load_generator(work)
    reasoner = load_reasoner(work, generator=generator.pipe.transformer)
    record = train_action_stage(generator, reasoner, cfg, log)
    state = generator.pipe.transformer.state_dict()
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file({trained.TRANSFORMER + k: v.contiguous() for k, v in state.items()}, str(out))
    out.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True,
                        help="the trained transformer's safetensors (and a .json record)")
    parser.add_argument("--work", type=Path, default=None,
                        help="where to build the world directory (default: beside --out)")
    parser.add_argument("--steps", type=int, default=ActionStageConfig.steps)
    parser.add_argument("--eval-every", type=int, default=ActionStageConfig.eval_every)
    parser.add_argument("--num-eval", type=int, default=ActionStageConfig.num_eval)
    parser.add_argument("--lr", type=float, default=ActionStageConfig.learning_rate)
    parser.add_argument("--pool-clips", type=int, default=ActionStageConfig.pool_clips)
    parser.add_argument("--action-sigma-shift", type=float,
                        default=ActionStageConfig.action_sigma_shift)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = ActionStageConfig(steps=args.steps, eval_every=args.eval_every,
                            num_eval=args.num_eval, learning_rate=args.lr,
                            pool_clips=args.pool_clips,
                            action_sigma_shift=args.action_sigma_shift)
    work = args.work or args.out.parent / "world"
    run(work, args.out, cfg, lambda e: print(json.dumps(e), flush=True))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
