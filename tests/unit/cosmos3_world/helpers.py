"""Helpers shared by the Cosmos3 world-session tests."""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image

from worldserve.models.types import WorldSessionSettings

SIZE = 64
NEW_FRAMES = 8  # 2 latent frames x the Wan2.2 VAE's 4x temporal stride


def settings(first_frame: bytes | None, seed: int = 3, **fields) -> WorldSessionSettings:
    values = dict(seed=seed, width=SIZE, height=SIZE, num_inference_steps=2, sink_frames=0,
                  window_frames=16, frames_per_block=2, first_frame=first_frame)
    values.update(fields)
    return WorldSessionSettings(**values)


def frames_of(output, size: int = SIZE) -> np.ndarray:
    return np.frombuffer(output.frames, np.uint8).reshape(output.num_frames, size, size, 3)


def start_image(first_frame: bytes) -> Image.Image:
    """first_frame fitted to the session size, as a client would prepare it."""
    from PIL import ImageOps

    image = Image.open(io.BytesIO(first_frame)).convert("RGB")
    return ImageOps.fit(image, (SIZE, SIZE), Image.Resampling.BICUBIC)


def reference_chunks(pipe, image: Image.Image, poses: list[torch.Tensor], seed: int = 3,
                     steps: int = 2, guidance_scale: float = 1.0,
                     prompt: str = "a road") -> tuple[list, list]:
    """What a client gets by chaining `Cosmos3OmniPipeline.__call__` itself: each call is
    camera_pose forward dynamics from the previous call's last frame with that chunk's pose
    deltas; one generator throughout. Returns (emitted uint8 frames, input image) per chunk."""
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition

    generator = torch.Generator().manual_seed(seed)
    emitted, inputs = [], []
    for k, raw in enumerate(poses):
        inputs.append(np.asarray(image))
        action = CosmosActionCondition(mode="forward_dynamics", chunk_size=NEW_FRAMES,
                                       domain_name="camera_pose", resolution_tier=256,
                                       raw_actions=raw, image=image)
        out = pipe(prompt=prompt, action=action, fps=24.0, num_inference_steps=steps,
                   guidance_scale=guidance_scale, generator=generator, output_type="np",
                   enable_safety_check=False)
        frames = (np.asarray(out.video) * 255).round().clip(0, 255).astype(np.uint8)
        image = Image.fromarray(frames[-1])
        emitted.append(frames if k == 0 else frames[1:])
    return emitted, inputs
