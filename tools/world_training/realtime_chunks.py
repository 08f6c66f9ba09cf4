"""A realtime session's later chunks: teacher-forced training rows and the per-chunk evaluation.

The runner denoises chunk k >= 1 over the session's cache: the K/V of chunks 0..k-1, each
written by a clean pass at t = 0 on the chunk's latents that attends the cache before it
(`CausalRunner._commit`). Training reproduces that cache from a longer agent clip's clean
latents (teacher forcing): one pass at t = 0 over latent frames 0..3k-1 under the block-causal
mask (equal to the runner's chunk-by-chunk commits, tests/unit/realtime), then chunk k's latent
frames noised at one of the runner's sigmas, denoised at positions 3k..3k+2 with that K/V as
`past_kv` and the camera vectors of the keys the server hands chunk k (a session's script is
cut per chunk by output frames: 9, then 12 each).

Session clips hold one key set per chunk, the next chunk's often the opposite one (the server
benchmark's sessions: a key, its opposite, the key again), sometimes switching within a chunk.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from tools.world_training.train_vae import to_pixels
from worldserve.models.causal_dit.camera import camera_vectors, output_frames_per_latent
from worldserve.models.causal_dit.loader import RealtimeModel
from worldserve.models.causal_dit.model import block_causal_mask
from worldserve.models.causal_dit.runner import CausalRunner, dmd_sigmas, pin_first_frame
from worldserve.models.causal_dit.vae_stream import temporal_upsampling
from worldserve.models.dev.world.grammar import describe
from worldserve.models.dev.world.render import png_bytes
from worldserve.models.dev.world.scenes import WorldClip, agent_clip, make_clip
from worldserve.models.dev.world.vocab import KEY_STEPS, OPPOSITE_KEYS
from worldserve.models.types import WorldSessionSettings

NUM_CHUNKS = 3  # the server benchmark's sessions (benchmarks/quality.py REALTIME_CHUNKS)
KEY_OPTIONS = [[]] + [[k] for k in KEY_STEPS]  # held key sets: none or one key (scripts, evals)


def clip_latents(model: RealtimeModel, frames: np.ndarray) -> torch.Tensor:
    """(C, F, h, w): the clip's latents, frame 0 replaced by the session's own encoding of it
    (the PNG a client sends, decoded and encoded by `encode_image`)."""
    latents = model.encode_video(to_pixels(frames))[0].clone()
    c = model.config
    image = Image.open(io.BytesIO(png_bytes(frames[0]))).convert("RGB")
    latents[:, :1] = model.encode_image(image, c.default_width, c.default_height)[0].clone()
    return latents


def session_settings(model: RealtimeModel, seed: int, first_frame: bytes) -> WorldSessionSettings:
    c = model.config
    return WorldSessionSettings(
        seed=seed, width=c.default_width, height=c.default_height,
        num_inference_steps=c.default_num_inference_steps, sink_frames=c.default_sink_frames,
        window_frames=c.default_window_frames, frames_per_block=c.frames_per_block,
        first_frame=first_frame)


@dataclass
class SessionPool:
    latents: torch.Tensor  # (N, C, 3 * NUM_CHUNKS, h, w), frame 0 as a session encodes it
    cameras: torch.Tensor  # (N, 3 * NUM_CHUNKS, K): each chunk's vectors, as the runner builds
    prompts: list[str]


def chunk_entries(model: RealtimeModel) -> list[int]:
    """Output frames (script entries) per chunk of a session: 9, 12, 12."""
    fb, up = model.config.frames_per_block, temporal_upsampling(model.vae)
    return [sum(output_frames_per_latent(k == 0, fb, up)) for k in range(NUM_CHUNKS)]


def session_keys(rng: np.random.Generator, entries: list[int],
                 opposite_share: float = 0.5, switch_share: float = 0.25) -> list[list[str]]:
    """One key set per script entry: a held key set per chunk (the previous chunk's opposite
    with `opposite_share`), switching to another one within the chunk with `switch_share`."""
    script: list[list[str]] = []
    held: list[str] = []
    for count in entries:
        if held and held[0] in OPPOSITE_KEYS and rng.random() < opposite_share:
            held = [OPPOSITE_KEYS[held[0]]]
        else:
            held = list(KEY_OPTIONS[int(rng.integers(len(KEY_OPTIONS)))])
        chunk = [list(held) for _ in range(count)]
        if rng.random() < switch_share:
            split = int(rng.integers(1, count))
            held = list(KEY_OPTIONS[int(rng.integers(len(KEY_OPTIONS)))])
            chunk[split:] = [list(held) for _ in range(count - split)]
        script += chunk
    return script


def session_camera(model: RealtimeModel, script: list[list[str]]) -> torch.Tensor:
    """(3 * NUM_CHUNKS, K): every chunk's camera vectors from its slice of the script."""
    fb, up = model.config.frames_per_block, temporal_upsampling(model.vae)
    vectors, start = [], 0
    for k, count in enumerate(chunk_entries(model)):
        counts = output_frames_per_latent(k == 0, fb, up)
        vectors.append(camera_vectors(script[start:start + count], counts, up * fb))
        start += count
    return torch.cat(vectors)


def session_clip(entries: list[int], script: list[list[str]], seed: int) -> WorldClip:
    """The agent clip of a whole session keyed by `script` (one key set per output frame, cut
    per chunk by `entries`): each later chunk's frames move by its own chunk's keys (what the
    server benchmark scores: 12 steps from the previous chunk's last frame), so the first
    chunk's last entry moves nothing."""
    return agent_clip(seed, script[:entries[0] - 1] + script[entries[0]:])


def build_session_pool(model: RealtimeModel, seeds: range, key_seed: int) -> SessionPool:
    """Agent clips of a whole session (33 frames, `session_clip`), their latents (frame 0 as
    `encode_image` gives it) and cameras."""
    latents, cameras, prompts = [], [], []
    entries = chunk_entries(model)
    for seed in seeds:
        script = session_keys(np.random.default_rng([23, key_seed, seed]), entries)
        clip = session_clip(entries, script, seed)
        latents.append(clip_latents(model, clip.frames))
        cameras.append(session_camera(model, script))
        prompts.append(describe(clip.scene, "agent"))
    return SessionPool(torch.stack(latents), torch.stack(cameras), prompts)


@torch.no_grad()
def own_context(model: RealtimeModel, x0_all: torch.Tensor, cam_all: torch.Tensor, chunks: int,
                text_kv: list) -> torch.Tensor:
    """(B, C, 3 * chunks, h, w): the model's own clean latents of the session's first `chunks`
    chunks, sampled as the runner does (frame 0 pinned to the clip's, the DMD steps over the
    cache, a clean pass at t = 0 committing each chunk) from the clip's keys."""
    dit, fb = model.dit, model.config.frames_per_block
    sigmas = dmd_sigmas(model.config.default_num_inference_steps, model.config.timestep_shift)
    b = x0_all.shape[0]
    kv, out = None, []
    for chunk in range(chunks):
        span = slice(fb * chunk, fb * (chunk + 1))
        positions, cam = torch.arange(span.start, span.stop), cam_all[:, span]
        pin = x0_all[:, :, :1] if chunk == 0 else None
        x = pin_first_frame(torch.randn_like(x0_all[:, :, span]), pin)
        for i, sigma in enumerate(sigmas):
            t = torch.full((b, fb), sigma * 1000.0)
            if pin is not None:
                t[:, 0] = 0.0
            v, _ = dit(x, t, cam, positions, text_kv, past_kv=kv)
            x0 = pin_first_frame(x - sigma * v, pin)
            if i + 1 < len(sigmas):
                x = pin_first_frame((1 - sigmas[i + 1]) * x0 + sigmas[i + 1] * torch.randn_like(x0),
                                    pin)
        _, new = dit(x0, torch.zeros(b, fb), cam, positions, text_kv, past_kv=kv)
        kv = new if kv is None else [(torch.cat([k, nk], 2), torch.cat([v, nv], 2))
                                     for (k, v), (nk, nv) in zip(kv, new)]
        out.append(x0)
    return torch.cat(out, dim=2)


def later_chunk_loss(model: RealtimeModel, pool: SessionPool, index: np.ndarray, chunk: int,
                     rng: np.random.Generator, text: torch.Tensor,
                     self_forced: bool = False, context_noise: float = 0.0) -> torch.Tensor:
    """Flow loss of chunk `chunk` (>= 1) of the rows `index`, denoised over the cache the
    runner would hold after committing the clip's clean chunks before it, or (`self_forced`)
    the model's own chunks before it, sampled from the same first frame and keys; with
    `context_noise`, those chunks' latents (not the pinned first frame) carry Gaussian noise of
    that scale, still committed at t = 0, so a slightly wrong context is one seen in training."""
    dit, fb = model.dit, model.config.frames_per_block
    x0_all, cam_all = pool.latents[index], pool.cameras[index]
    b, past = len(index), fb * chunk
    text_kv = dit.text_kv(text.expand(b, -1, -1))
    context = x0_all[:, :, :past]
    if self_forced:
        context = own_context(model, x0_all, cam_all, chunk, [
            (k.detach(), v.detach()) for k, v in text_kv])
    if context_noise:
        noise = context_noise * torch.randn_like(context)
        noise[:, :, :1] = 0.0
        context = context + noise
    h, w = x0_all.shape[3:]
    mask = block_causal_mask(past, fb, dit.tokens_per_frame(h, w))
    _, kv = dit(context, torch.zeros(b, past), cam_all[:, :past], torch.arange(past), text_kv,
                mask=mask)
    sigmas = dmd_sigmas(model.config.default_num_inference_steps, model.config.timestep_shift)
    step = rng.integers(len(sigmas), size=b)
    sigma = torch.tensor([sigmas[i] for i in step])[:, None, None, None, None]
    t = torch.tensor([sigmas[i] * 1000.0 for i in step])[:, None].repeat(1, fb)
    x0 = x0_all[:, :, past:past + fb]
    noise = torch.randn_like(x0)
    v, _ = dit((1 - sigma) * x0 + sigma * noise, t, cam_all[:, past:past + fb],
               torch.arange(past, past + fb), text_kv, past_kv=kv)
    return ((v - (noise - x0)) ** 2).mean()


def session_chunks(runner: CausalRunner, clip: WorldClip, keys: list[str],
                   seed: int) -> list[np.ndarray]:
    """The decoded frames (T, H, W, 3) of each chunk of a session started from the clip's first
    frame, `keys[k]` held for all of chunk k (a script of one entry per output frame)."""
    model = runner.model
    c = model.config
    session = runner.new_session(f"eval-{seed}", session_settings(
        model, seed, png_bytes(clip.frames[0])), describe(clip.scene, "agent"))
    chunks = []
    for key, count in zip(keys, chunk_entries(model)):
        out = runner.run_chunk(session, [[key]] * count)
        chunks.append(np.frombuffer(out.frames, dtype=np.uint8).reshape(
            out.num_frames, c.default_height, c.default_width, 3))
    return chunks


@torch.no_grad()
def evaluate_sessions(model: RealtimeModel, num_clips: int, seed: int = 0) -> dict[str, object]:
    """Sessions of NUM_CHUNKS chunks through the serving runner on held-out agent clips, keyed
    and scored as the server benchmark does (`benchmarks/quality.py`: a key, its opposite, the
    key again, each held for its whole chunk; `score_chunk` from the previous chunk's last
    frame): the response per chunk and the colour kept."""
    from benchmarks.quality import chunk_keys, score_chunk

    model.dit.eval()
    runner = CausalRunner(model)
    rng = np.random.default_rng(seed)
    moved: list[list[bool]] = [[] for _ in range(NUM_CHUNKS)]
    kept = []
    for index in range(num_clips):
        clip = make_clip(seed + index, "agent")
        keys = chunk_keys("wasd"[int(rng.integers(4))], NUM_CHUNKS)
        reference = None
        for k, (key, frames) in enumerate(zip(keys, session_chunks(runner, clip, keys,
                                                                   seed + index))):
            response, colour = score_chunk(reference, frames, key, clip.scene.colour)
            moved[k].append(response)
            kept.append(colour)
            reference = frames[-1]
    model.dit.train()
    return {"response_per_chunk": [round(float(np.mean(m)), 3) for m in moved],
            "colour_kept": round(float(np.mean(kept)), 3)}
