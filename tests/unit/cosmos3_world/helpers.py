"""Helpers shared by the Cosmos3 world-session tests."""

from __future__ import annotations

import io
import math

import numpy as np
import torch
from PIL import Image

from worldserve.models.types import WorldSessionSettings

SIZE = 64
NEW_FRAMES = 8  # 2 latent frames x the Wan2.2 VAE's 4x temporal stride
STEP, ANGLE = 0.05, math.radians(1.2)  # SANA-WM's rollout: units and radians per frame
# The documented key -> 9-D pose delta mapping ([tx, ty, tz, r00, r10, r20, r01, r11, r21],
# worldserve/models/cosmos3/world.py), written out: references built from it go through no
# worldserve code that turns keys into poses.
POSE_OF = {
    "": [0, 0, 0, 1, 0, 0, 0, 1, 0],  # no key held
    "w": [0, 0, STEP, 1, 0, 0, 0, 1, 0],  # forward (+z)
    "s": [0, 0, -STEP, 1, 0, 0, 0, 1, 0],  # back
    "a": [-STEP, 0, 0, 1, 0, 0, 0, 1, 0],  # left (-x)
    "d": [STEP, 0, 0, 1, 0, 0, 0, 1, 0],  # right
    "l": [0, 0, 0, math.cos(ANGLE), 0, -math.sin(ANGLE), 0, 1, 0],  # yaw right
    "j": [0, 0, 0, math.cos(ANGLE), 0, math.sin(ANGLE), 0, 1, 0],  # yaw left
    "i": [0, 0, 0, 1, 0, 0, 0, math.cos(ANGLE), math.sin(ANGLE)],  # pitch
    "k": [0, 0, 0, 1, 0, 0, 0, math.cos(ANGLE), -math.sin(ANGLE)],  # pitch back
}


def poses(*runs: tuple[str, int]) -> torch.Tensor:
    """(n, 9) float32 pose deltas from runs of one held key, e.g. poses(("w", 4), ("", 4))."""
    return torch.tensor([POSE_OF[key] for key, count in runs for _ in range(count)],
                        dtype=torch.float32)


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


def assert_frames_match(got: np.ndarray, want: np.ndarray, label: str = "") -> None:
    """Frames against a reference fed the written-out poses: those are the documented values,
    while the runner's rollout computes them in float64 and rounds to float32, an ulp (~2e-8)
    away, which can move the odd pixel by one uint8 level. A wrong pose, image or prompt moves
    whole frames."""
    assert got.shape == want.shape, label
    diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
    assert diff.max() <= 1 and (diff > 0).mean() < 0.01, (label, diff.max(), (diff > 0).mean())


def reference_chunks(pipe, image: Image.Image, chunk_poses: list[torch.Tensor], seed: int = 3,
                     steps: int = 2, guidance_scale: float = 1.0,
                     prompts: list[str] | None = None) -> tuple[list, list]:
    """What a client gets by chaining `Cosmos3OmniPipeline.__call__` itself: each call is
    camera_pose forward dynamics from the previous call's last frame with that chunk's pose
    deltas and prompt ("a road" unless `prompts` says); one generator throughout. Returns
    (emitted uint8 frames, input image) per chunk."""
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition

    generator = torch.Generator().manual_seed(seed)
    emitted, inputs = [], []
    prompts = prompts or ["a road"] * len(chunk_poses)
    for k, (raw, prompt) in enumerate(zip(chunk_poses, prompts)):
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
