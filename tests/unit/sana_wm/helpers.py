"""Helpers shared by the SANA-WM realtime tests."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from worldserve.models.types import WorldSessionSettings

SIZE = 64
NEW_FRAMES = 24  # 3 latent frames x the LTX-2 VAE's 8x temporal stride


def settings(first_frame: bytes | None, seed: int = 3, **fields) -> WorldSessionSettings:
    values = dict(seed=seed, width=SIZE, height=SIZE, num_inference_steps=2, sink_frames=1,
                  window_frames=11, frames_per_block=3, first_frame=first_frame)
    values.update(fields)
    return WorldSessionSettings(**values)


def frames_of(output, size: int = SIZE) -> np.ndarray:
    return np.frombuffer(output.frames, np.uint8).reshape(output.num_frames, size, size, 3)


def reference_chunks(pipe, image: Image.Image, actions: list[str], seed: int = 3,
                     steps: int = 2, guidance_scale: float = 1.0,
                     intrinsics: list[float] | None = None) -> tuple[list, list]:
    """What a client gets by chaining `SanaWMPipeline.__call__` itself: each call starts from
    the previous call's last frame with that chunk's action string (the pipeline's own DSL,
    written out by the caller: no worldserve code turns keys into actions here); one generator
    throughout. Returns (emitted uint8 frames per chunk, new stage-1 latents per chunk)."""
    generator = torch.Generator().manual_seed(seed)
    focal = float(max(image.size))
    intrinsics = np.asarray([intrinsics or [focal, focal, image.width / 2, image.height / 2]],
                            np.float32)
    frames_out, latents_out = [], []
    for k, action in enumerate(actions):
        out = pipe(image=image, prompt="a road", action=action,
                   intrinsics=intrinsics[0], height=SIZE, width=SIZE,
                   num_frames=NEW_FRAMES + 1, num_inference_steps=steps,
                   guidance_scale=guidance_scale, generator=generator)
        frames = (out.frames * 255).round().clip(0, 255).astype(np.uint8)
        if k == 0:  # later calls start from a frame already at the session size
            _, intrinsics = pipe.image_processor.preprocess_with_intrinsics(
                image, intrinsics, SIZE, SIZE)
        image = Image.fromarray(frames[-1])
        frames_out.append(frames if k == 0 else frames[1:])
        latents_out.append(out.latent if k == 0 else out.latent[:, :, 1:])
    return frames_out, latents_out
