"""Train the causal realtime dev model's DiT on the dev world's agent clips: keys move the agent.

A session from an agent clip's first frame (`first_frame` in the init; the checkpoint declares
`image_conditioning`) is forward dynamics: the runner pins that frame's latent clean at t = 0
and denoises the chunk's later latent frames in `default_num_inference_steps` steps at
`dmd_sigmas` (linspace(1, 0) warped by `timestep_shift`). Training does the same on chunk 0 of
9-frame agent clips: frame 0's latent clean (`RealtimeModel.encode_image`, as a session encodes
its first frame), latent frames 1 and 2 noised at one of the runner's sigmas, the flow loss on
them (target noise - x0, the runner's `x0 = x - sigma * v`), camera vectors built by the
runner's own `camera_vectors` from the keys the clip held (worldserve.models.camera_keys'
convention: entry j produced frame j + 1, as a client sends them). A share of rows has frame 0
noisy too, so a session without a first frame still draws a scene. The VAE is trained first
(`train_vae --model realtime`) and stays frozen here. With `--session-clips`, a share of the
steps trains a session's chunk 1 or 2 over the cache of the clip's clean chunks before it
(`realtime_chunks.py`); `--init` fine-tunes a file in the shipped layout instead of starting
from the seeded DiT.

Held-out figures go through the serving runner (`CausalRunner.new_session` / `run_chunk`) on
agent clips below `TRAIN_SEED_BASE`, read by the world's evaluator: action response (the agent
moved the way the keys command, within the first chunk) and colour kept (last frame); with
session clips also per chunk of 3-chunk sessions keyed as the server benchmark's.

    python -m tools.world_training.train_vae --model realtime --out /tmp/realtime-vae.safetensors
    python -m tools.world_training.train_realtime --vae /tmp/realtime-vae.safetensors \
        --out /tmp/realtime-world.safetensors
    python -m tools.world_training.train_realtime --init /tmp/realtime-world.safetensors \
        --session-clips 1024 --learning-rate 1e-3 --out /tmp/realtime-later.safetensors

(docs/dev-world.md "The realtime model" gives the shipped runs' arguments.)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tools.world_training.realtime_chunks import (
    KEY_OPTIONS,
    NUM_CHUNKS,
    SessionPool,
    build_session_pool,
    clip_latents,
    evaluate_sessions,
    later_chunk_loss,
    session_settings,
)
from tools.world_training.train_vae import TRAIN_SEED_BASE
from worldserve.models.causal_dit.camera import camera_vectors, output_frames_per_latent
from worldserve.models.causal_dit.loader import RealtimeModel
from worldserve.models.causal_dit.runner import CausalRunner, dmd_sigmas
from worldserve.models.causal_dit.vae_stream import temporal_upsampling
from worldserve.models.dev.world.evaluate import expected_agent_direction, read_clip, read_frame
from worldserve.models.dev.world.grammar import describe
from worldserve.models.dev.world.render import png_bytes
from worldserve.models.dev.world.scenes import WorldConfig, make_clip

SESSION_SEED_OFFSET = 500_000  # session clips' seeds: apart from the chunk-0 pool's


@dataclass(frozen=True)
class RealtimeTrainConfig:
    steps: int = 3000
    batch_size: int = 32
    pool_clips: int = 4096  # agent clips encoded once
    learning_rate: float = 2e-3
    warmup_steps: int = 100
    free_first_frame: float = 0.1  # rows with frame 0 noisy too (sessions without an image)
    empty_prompt: float = 0.25  # steps trained with the empty prompt
    full_chunk_keys: float = 0.5  # rows whose keys are padded to a full chunk (a held key)
    eval_clips: int = 40
    eval_every: int = 500
    seed: int = 0
    session_clips: int = 0  # whole-session clips for the later chunks (0: chunk 0 only)
    later_share: float = 0.6  # steps training chunk 1 or 2 (of a session pool)
    self_forced: float = 0.0  # of those, over the model's own earlier chunks (not the clip's)
    later_weights: tuple[int, ...] = (1, 1)  # how often those train chunk 1, chunk 2 (relative)
    context_noise: float = 0.0  # noise on the later-chunk rows' context latents (not frame 0)


@dataclass
class Pool:
    latents: torch.Tensor  # (N, C, F, h, w) model-space, frame 0 as a session encodes it
    keys: list[list[list[str]]]  # per clip, one key set per step
    prompts: list[str]


def chunk_camera(model: RealtimeModel, keys: list[list[str]] | None) -> torch.Tensor:
    """(F, num_keys) camera vectors of chunk 0, exactly as the runner builds them."""
    fb, up = model.config.frames_per_block, temporal_upsampling(model.vae)
    return camera_vectors(keys, output_frames_per_latent(True, fb, up), up * fb)


def build_pool(model: RealtimeModel, cfg: RealtimeTrainConfig) -> Pool:
    latents, keys, prompts = [], [], []
    for index in range(cfg.pool_clips):
        clip = make_clip(TRAIN_SEED_BASE + cfg.seed * cfg.pool_clips + index, "agent")
        latents.append(clip_latents(model, clip.frames))
        keys.append(clip.keys_per_step)
        prompts.append(describe(clip.scene, "agent"))
    return Pool(torch.stack(latents), keys, prompts)


def row_keys(keys: list[list[str]], full_chunk: bool, max_entries: int) -> list[list[str]]:
    """The clip's keys, or padded with its last key set to a full chunk (a client holding it)."""
    if not full_chunk or not keys:
        return keys
    return keys + [keys[-1]] * (max_entries - len(keys))


def noisy_batch(model: RealtimeModel, pool: Pool, rng: np.random.Generator,
                cfg: RealtimeTrainConfig) -> dict[str, torch.Tensor]:
    """x_t, timesteps, camera and flow target of one batch at the runner's sigmas (one prompt
    a step: the first row's, so `index` says which pool clips the rows are)."""
    mc = model.config
    index = rng.integers(len(pool.keys), size=cfg.batch_size)
    x0 = pool.latents[index]
    sigmas = dmd_sigmas(mc.default_num_inference_steps, mc.timestep_shift)
    step = torch.from_numpy(rng.integers(len(sigmas), size=cfg.batch_size))
    per_frame = torch.tensor(sigmas)[step][:, None].repeat(1, x0.shape[2])
    # The runner's timesteps: float32(sigma * 1000) of each Python sigma.
    t = torch.tensor([s * 1000.0 for s in sigmas])[step][:, None].repeat(1, x0.shape[2])
    pinned = torch.from_numpy(rng.random(cfg.batch_size) >= cfg.free_first_frame)
    per_frame[pinned, 0] = 0.0  # the image frame is clean at every step
    t[pinned, 0] = 0.0
    noise = torch.randn_like(x0)
    s = per_frame[:, None, :, None, None]
    max_entries = temporal_upsampling(model.vae) * mc.frames_per_block
    full = rng.random(cfg.batch_size) < cfg.full_chunk_keys
    camera = torch.stack([chunk_camera(model, row_keys(pool.keys[i], f, max_entries))
                          for i, f in zip(index.tolist(), full)])
    return {"x": (1 - s) * x0 + s * noise, "t": t, "camera": camera,
            "target": noise - x0, "weight": (per_frame > 0).float()[:, None, :, None, None],
            "index": torch.from_numpy(index)}


def flow_loss(model: RealtimeModel, batch: dict[str, torch.Tensor],
              text: torch.Tensor) -> torch.Tensor:
    """Squared velocity error on the noisy latent frames (chunk 0 of a session: positions
    0..F-1, no cache)."""
    x = batch["x"]
    positions = torch.arange(x.shape[2])
    text_kv = model.dit.text_kv(text.expand(x.shape[0], -1, -1))
    v, _ = model.dit(x, batch["t"], batch["camera"], positions, text_kv)
    err = (v - batch["target"]) ** 2 * batch["weight"]
    return err.sum() / (batch["weight"].sum() * x.shape[1] * x.shape[3] * x.shape[4])


def first_chunk(runner: CausalRunner, frame0: np.ndarray, keys: list[list[str]], prompt: str,
                seed: int) -> np.ndarray:
    """The first chunk's decoded frames (T, H, W, 3) of a session started from `frame0`."""
    settings = session_settings(runner.model, seed, png_bytes(frame0))
    session = runner.new_session(f"eval-{seed}", settings, prompt)
    out = runner.run_chunk(session, keys)
    h, w = settings.height, settings.width
    return np.frombuffer(out.frames, dtype=np.uint8).reshape(out.num_frames, h, w, 3)


@torch.no_grad()
def evaluate(model: RealtimeModel, num_clips: int, held: bool = False) -> dict[str, float]:
    """Through the serving runner on held-out agent clips: the clip's own keys, or (`held`) one
    key set held for the whole chunk, cycling over none and every key."""
    model.dit.eval()
    runner = CausalRunner(model)
    step_px = WorldConfig().step_px
    response, colour = [], []
    for seed in range(num_clips):
        clip = make_clip(seed, "agent")
        keys = clip.keys_per_step
        if held:
            keys = [list(KEY_OPTIONS[seed % len(KEY_OPTIONS)]) for _ in keys]
        frames = first_chunk(runner, clip.frames[0], keys, describe(clip.scene, "agent"), seed)
        # The command is read from the clip's own first frame, not the decoded one: a decoder
        # that loses the agent must not make "still" count as a response.
        expected = expected_agent_direction(clip.frames[0], keys, step_px)
        response.append(read_clip(frames).direction == expected)
        colour.append(read_frame(frames[-1]).colour == clip.scene.colour)
    model.dit.train()
    return {"action_response": float(np.mean(response)), "colour_kept": float(np.mean(colour))}


def later_chunk(rng: np.random.Generator, weights: tuple[int, ...]) -> int:
    """Chunk 1, 2, ... drawn by relative integer `weights`: one draw over their sum, so equal
    weights draw exactly as a uniform `rng.integers` over the chunks (the runs before the
    weights existed)."""
    draw = int(rng.integers(sum(weights)))
    return 1 + int(np.searchsorted(np.cumsum(weights), draw, side="right"))


def step_loss(model: RealtimeModel, pool: Pool, sessions: SessionPool | None,
              rng: np.random.Generator, cfg: RealtimeTrainConfig,
              states: dict[str, torch.Tensor]) -> torch.Tensor:
    """One step's loss: chunk 0 rows, or (`later_share` of the steps, with a session pool) one
    later chunk's rows over the cache of the clips' clean chunks before it. One prompt a step."""
    if sessions is not None and rng.random() < cfg.later_share:
        index = rng.integers(len(sessions.prompts), size=cfg.batch_size)
        chunk = later_chunk(rng, cfg.later_weights)
        prompt = "" if rng.random() < cfg.empty_prompt else sessions.prompts[int(index[0])]
        return later_chunk_loss(model, sessions, index, chunk, rng, states[prompt],
                                self_forced=rng.random() < cfg.self_forced,
                                context_noise=cfg.context_noise)
    batch = noisy_batch(model, pool, rng, cfg)
    prompt = "" if rng.random() < cfg.empty_prompt else pool.prompts[int(batch["index"][0])]
    return flow_loss(model, batch, states[prompt])


def figures(model: RealtimeModel, num_clips: int, sessions: bool) -> dict[str, Any]:
    """Chunk 0 with the clips' own keys; with `sessions` also the per-chunk session figures."""
    out: dict[str, Any] = evaluate(model, num_clips)
    if sessions:
        out["sessions"] = evaluate_sessions(model, num_clips)
    return out


def learning_rate(step: int, cfg: RealtimeTrainConfig) -> float:
    if step <= cfg.warmup_steps:
        return cfg.learning_rate * step / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.learning_rate * 0.5 * (1 + math.cos(math.pi * progress))


def train(model: RealtimeModel, cfg: RealtimeTrainConfig, log: Any = print) -> list[dict]:
    """Train `model.dit` in place on agent clips; returns the evaluation log."""
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng([11, cfg.seed])
    start = time.process_time()
    pool = build_pool(model, cfg)
    sessions = None
    if cfg.session_clips:
        first = TRAIN_SEED_BASE + SESSION_SEED_OFFSET + cfg.seed * cfg.session_clips
        sessions = build_session_pool(model, range(first, first + cfg.session_clips), cfg.seed)
    log({"pool_clips": cfg.pool_clips, "session_clips": cfg.session_clips,
         "pool_cpu_s": round(time.process_time() - start, 1)})
    prompts = set(pool.prompts) | set(sessions.prompts if sessions else []) | {""}
    states = {p: model.prompt_states(p).clone() for p in prompts}
    history = [{"step": 0, **figures(model, cfg.eval_clips, sessions is not None)}]
    log(history[-1])
    model.dit.train()
    optimiser = torch.optim.AdamW(model.dit.parameters(), lr=cfg.learning_rate,
                                  weight_decay=0.01)
    start = time.process_time()
    for step in range(1, cfg.steps + 1):
        for group in optimiser.param_groups:
            group["lr"] = learning_rate(step, cfg)
        loss = step_loss(model, pool, sessions, rng, cfg, states)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.dit.parameters(), 1.0)
        optimiser.step()
        if step % cfg.eval_every == 0 or step == cfg.steps:
            entry = {"step": step, "loss": round(float(loss.detach()), 4),
                     "train_cpu_s": round(time.process_time() - start, 1),
                     **figures(model, cfg.eval_clips, sessions is not None)}
            history.append(entry)
            log(entry)
    model.dit.eval()
    return history


def load_trained_vae(model: RealtimeModel, path: str) -> None:
    """The trained VAE's tensors (strictly) and its latent statistics (file metadata)."""
    from safetensors import safe_open

    with safe_open(path, framework="pt") as handle:
        state = {k: handle.get_tensor(k) for k in handle.keys()}
        metadata = handle.metadata()
    model.vae.load_state_dict(state, strict=True)
    model.vae.register_to_config(latents_mean=json.loads(metadata["latents_mean"]),
                                 latents_std=json.loads(metadata["latents_std"]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--vae", help="train_vae --model realtime's output (train from scratch)")
    source.add_argument("--init", help="fine-tune a file in the shipped layout (its VAE too)")
    parser.add_argument("--steps", type=int, default=RealtimeTrainConfig.steps)
    parser.add_argument("--learning-rate", type=float, default=RealtimeTrainConfig.learning_rate)
    parser.add_argument("--eval-every", type=int, default=RealtimeTrainConfig.eval_every)
    parser.add_argument("--pool-clips", type=int, default=RealtimeTrainConfig.pool_clips)
    parser.add_argument("--session-clips", type=int, default=RealtimeTrainConfig.session_clips,
                        help="whole-session clips for training chunks 1 and 2 (0: chunk 0 only)")
    parser.add_argument("--self-forced", type=float, default=RealtimeTrainConfig.self_forced,
                        help="share of later-chunk steps over the model's own earlier chunks")
    parser.add_argument("--later-weights", type=int, nargs=NUM_CHUNKS - 1,
                        default=RealtimeTrainConfig.later_weights, metavar="W",
                        help="relative weights of chunk 1 and chunk 2 in the later-chunk steps")
    parser.add_argument("--context-noise", type=float, default=RealtimeTrainConfig.context_noise,
                        help="noise scale on the later-chunk rows' context latents")
    parser.add_argument("--final-eval", type=int, default=100,
                        help="held-out clips for the final figures (every key kind)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    log = lambda entry: print(json.dumps(entry), flush=True)  # noqa: E731
    model, init_record = starting_model(args, log)
    cfg = RealtimeTrainConfig(steps=args.steps, learning_rate=args.learning_rate,
                              eval_every=args.eval_every, pool_clips=args.pool_clips,
                              session_clips=args.session_clips, self_forced=args.self_forced,
                              later_weights=tuple(args.later_weights),
                              context_noise=args.context_noise)
    start = time.process_time()
    history = train(model, cfg, log)
    cpu_min = round((time.process_time() - start) / 60, 1)
    final = {"clip_keys": evaluate(model, args.final_eval),
             "held_keys": evaluate(model, args.final_eval, held=True),
             "sessions": evaluate_sessions(model, args.final_eval)}
    log({"final": final, "cpu_min": cpu_min})
    record = {"config": asdict(cfg), "vae": args.vae, "init": args.init, "history": history,
              "final": final, "cpu_min": cpu_min, "init_training": init_record}
    save_weights(model, args.out, record)


def starting_model(args: argparse.Namespace, log: Any) -> tuple[RealtimeModel, Any]:
    """The seeded model with the trained VAE (`--vae`), or a shipped-layout file's DiT and VAE
    (`--init`) and that file's training record."""
    from worldserve.models.causal_dit.dev import build_realtime_model

    if args.init:
        return shipped_model(Path(args.init))
    model = build_realtime_model(0)
    model.config = dataclasses.replace(model.config, image_conditioning=True)
    log({"random_vae": evaluate(model, RealtimeTrainConfig.eval_clips)})
    load_trained_vae(model, args.vae)
    return model, None


def shipped_model(path: Path) -> tuple[RealtimeModel, Any]:
    """A file in the shipped layout as the serving model, and that file's training record."""
    from worldserve.models.causal_dit.dev import trained_realtime_model
    from worldserve.models.dev.world import trained

    _, metadata = trained.read(path)
    return trained_realtime_model(0, path), json.loads(metadata["training"])


def save_weights(model: RealtimeModel, path: str, record: dict[str, Any]) -> None:
    """The shipped layout (`causal_dit.dev.trained_realtime_model` reads it): `transformer.*`
    and `vae.*` tensors, the VAE's latent statistics and the training record as metadata."""
    from safetensors.torch import save_file

    from worldserve.models.dev.world.trained import TRANSFORMER, VAE

    tensors = {TRANSFORMER + k: v for k, v in model.dit.state_dict().items()}
    tensors.update({VAE + k: v for k, v in model.vae.state_dict().items()})
    vae_cfg = model.vae.config
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, path, metadata={
        "latents_mean": json.dumps(list(vae_cfg.latents_mean)),
        "latents_std": json.dumps(list(vae_cfg.latents_std)), "training": json.dumps(record)})


if __name__ == "__main__":
    main()
