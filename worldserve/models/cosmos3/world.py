"""Cosmos3 world sessions: chunked `forward_dynamics` in the `camera_pose` domain.

A Cosmos3 directory whose transformer has action heads (`action_gen`) serves realtime sessions
as a chain of action-conditioned image-to-video calls. Per chunk (L = frames_per_block latent
frames, the Wan2.2 VAE's 4x temporal stride, so `chunk_size` = 4L action steps):
1. the chunk's held camera keys (one key set per new frame) become `chunk_size` 9-D pose deltas
   (`pose_deltas`), so a key change takes effect at the next chunk boundary;
2. `Cosmos3OmniPipeline.__call__` runs `CosmosActionCondition(mode="forward_dynamics",
   domain_name="camera_pose", image=<the session's image>, raw_actions=<the deltas>)` with the
   session's prompt and its own generator: 1 + 4L frames; chunk 0 emits them all, later chunks
   drop their first (a copy of the frame they start from) and emit 4L;
3. the chunk's last frame becomes the session's image (the next chunk's condition).

Cosmos3 keeps no causal state between calls (every call re-encodes its start frame), so the
per-session state is one image at the session size, the prompt, the generator and counters.

Pose deltas (diffusers documents the camera_pose action as "a single ego/effector 9D pose":
3-D translation + the 6-D rotation of Zhou et al. 2019; whether the published checkpoints were
trained on per-step deltas or absolute poses, and in which axes, is not in the source, so the
mapping below is this project's choice and unverified against real weights): the keys are
rolled out with SANA-WM's own camera rollout (`diffusers.pipelines.sana_wm.cam_utils`, OpenCV
axes x right / y down / z forward, 0.05 units and 1.2 degrees per frame; W/S forward/back and
A/D left/right on the ground plane, I/K pitch up/down, J/L yaw left/right); step j's action is
the relative transform inv(c2w_j) @ c2w_{j+1} as [tx, ty, tz, r00, r10, r20, r01, r11, r21]
(translation, then the rotation's first two columns). No key held: [0, 0, 0, 1, 0, 0, 0, 1, 0].
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps

from worldserve.errors import InvalidRequest
from worldserve.models.camera_keys import action_string, check_camera
from worldserve.models.common import count_parameters, require_local_dir
from worldserve.models.cosmos3.family import PIPELINE_CLASS
from worldserve.models.detect import read_json
from worldserve.models.frames import to_uint8
from worldserve.models.types import (
    ChunkRunOutput,
    ModelLoadError,
    RealtimeModelFacts,
    WorldSessionSettings,
    WorldSessionState,
)

DOMAIN = "camera_pose"
DOMAIN_ID = 2  # diffusers `_EMBODIMENT_TO_DOMAIN_ID["camera_pose"]`
POSE_DIM = 9  # diffusers `_EMBODIMENT_TO_RAW_ACTION_DIM["camera_pose"]`
TIERS = (256, 480, 704, 720)  # `_ACTION_RESOLUTION_BINS`, smallest first


@dataclass(frozen=True)
class Cosmos3WorldDefaults:
    """Session defaults. Cosmos3's offline action default is 35 steps with guidance 6; a
    session's `num_inference_steps` / `guidance_scale` choose the realtime trade-off."""

    frames_per_block: int = 2  # latent frames per chunk: 8 new frames (chunk 0: 9)
    default_num_inference_steps: int = 8
    default_fps: int = 24
    default_width: int = 832  # the 480 tier's landscape canvas
    default_height: int = 480
    max_window_frames: int = 16  # no cache: sink/window only bound frames_per_block
    view_point: str = "ego_view"


def load_runner(model_dir: Path, *, dtype: str = "float32", device: str = "cpu") -> Cosmos3World:
    """The registry's realtime loader for a Cosmos3 directory: refused unless its transformer
    has action heads that fit the camera_pose domain."""
    from worldserve.models.cosmos3.loader import load_pipeline

    path = require_local_dir(model_dir)
    check_action_heads(path)
    return Cosmos3World(load_pipeline(path, dtype, device))


def check_action_heads(model_dir: Path) -> None:
    """ModelLoadError unless `transformer/config.json` has `action_gen` with room for the
    camera_pose domain (JSON read only)."""
    config = read_json(model_dir / "transformer" / "config.json") or {}
    if not config.get("action_gen"):
        raise ModelLoadError(
            f"{model_dir}: this Cosmos3 directory has no action heads (transformer/config.json "
            "action_gen is not true); the realtime stage serves Cosmos3 only as camera_pose "
            "forward dynamics, which needs an action-capable checkpoint")
    action_dim = int(config.get("action_dim") or 0)
    domains = int(config.get("num_embodiment_domains") or 0)
    if action_dim < POSE_DIM or domains <= DOMAIN_ID:
        raise ModelLoadError(
            f"{model_dir}: the Cosmos3 action heads cannot take camera_pose actions (action_dim "
            f"{action_dim} must be >= {POSE_DIM}, num_embodiment_domains {domains} > {DOMAIN_ID})")


# ---------------------------------------------------------------------------- camera -> poses


def pose_deltas(camera: list[list[str]] | None, num_steps: int) -> torch.Tensor:
    """(num_steps, 9) float32 pose deltas, one per action step (entry j: the keys held while
    frame j + 1 was produced; missing entries: no key)."""
    from diffusers.pipelines.sana_wm.cam_utils import action_string_to_c2w

    c2w = action_string_to_c2w(action_string(camera, num_steps)).astype(np.float64)
    relative = np.linalg.inv(c2w[:-1]) @ c2w[1:]
    rotation = relative[:, :3, :3]
    poses = np.concatenate([relative[:, :3, 3], rotation[:, :, 0], rotation[:, :, 1]], axis=1)
    return torch.from_numpy(poses.astype(np.float32))


def resolution_tier(width: int, height: int) -> int | None:
    """The smallest action tier whose canvas for this aspect holds width x height unscaled (the
    pipeline never upscales, so the output frames are then exactly width x height)."""
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import _ACTION_RESOLUTION_BINS
    from diffusers.video_processor import VideoProcessor

    for tier in TIERS:
        canvas_h, canvas_w = VideoProcessor.classify_height_width_bin(
            height, width, ratios=_ACTION_RESOLUTION_BINS[str(tier)])
        if canvas_h >= height and canvas_w >= width:
            return tier
    return None


def fit_image(image: Image.Image, width: int, height: int) -> Image.Image:
    """first_frame at the session size: scaled to cover, centre-cropped."""
    if image.size == (width, height):
        return image
    return ImageOps.fit(image, (width, height), Image.Resampling.BICUBIC)


# ---------------------------------------------------------------------------- sessions


class Cosmos3WorldCache:
    """Size facts of a session's state: no KV, one RGB frame."""

    def __init__(self, session: Cosmos3WorldSession) -> None:
        self._session = session

    @property
    def num_frames(self) -> int:
        return 0

    @property
    def num_tokens(self) -> int:
        return 0

    def nbytes(self) -> int:
        image = self._session.image
        return image.width * image.height * 3 if image is not None else 0


class Cosmos3WorldSession:
    """One session's state; `release()` drops it."""

    def __init__(self, session_id: str, settings: WorldSessionSettings, prompt: str,
                 image: Image.Image, tier: int) -> None:
        self.session_id = session_id
        # The encoded first_frame is not kept: `image` (at the session size) is the state.
        self.settings = dataclasses.replace(settings, first_frame=None)
        self.prompt = prompt
        self.image: Image.Image | None = image
        self.tier = tier
        # Noise is drawn on the CPU so a seed gives the same frames on every device.
        self.generator = torch.Generator(device="cpu").manual_seed(settings.seed)
        self.next_chunk = 0
        self.state = WorldSessionState.ACTIVE
        self.cache = Cosmos3WorldCache(self)

    def release(self) -> None:
        self.image = None
        self.state = WorldSessionState.RELEASED


class Cosmos3World:
    """Stateless over sessions: each session's image and generator live in its session."""

    def __init__(self, pipe: Any, defaults: Cosmos3WorldDefaults = Cosmos3WorldDefaults()) -> None:
        self.model = pipe
        self.defaults = defaults
        self.upsampling = int(pipe.vae.config.scale_factor_temporal)
        self.num_params = count_parameters(pipe)
        d = defaults
        self.facts = RealtimeModelFacts(
            pipeline=PIPELINE_CLASS, frames_per_block=d.frames_per_block, default_sink_frames=0,
            default_window_frames=d.max_window_frames, max_window_frames=d.max_window_frames,
            default_num_inference_steps=d.default_num_inference_steps,
            default_fps=d.default_fps, default_width=d.default_width,
            default_height=d.default_height,
            size_multiple=int(pipe.vae.config.scale_factor_spatial), min_pulse_items=1,
            first_frame="required", guidance=True)

    def new_session(self, session_id: str, settings: WorldSessionSettings,
                    prompt: str) -> Cosmos3WorldSession:
        from worldserve.models.cosmos3.inputs import decode_image

        if settings.first_frame is None:
            raise InvalidRequest(f"{PIPELINE_CLASS} sessions start from an image: first_frame "
                                 "is required in the init")
        tier = resolution_tier(settings.width, settings.height)
        if tier is None:
            raise InvalidRequest(f"size {settings.width}x{settings.height} fits no Cosmos3 action "
                                 "canvas (largest: 1280x720, 960x960, 1104x832)")
        image = decode_image(settings.first_frame, "first_frame")
        return Cosmos3WorldSession(session_id, settings, prompt,
                                   fit_image(image, settings.width, settings.height), tier)

    def chunk_frames(self, chunk_index: int, frames_per_block: int) -> int:
        """Chunk 0 emits its start image too (1 + 4L frames); later chunks 4L new frames."""
        return self.upsampling * frames_per_block + (1 if chunk_index == 0 else 0)

    @torch.inference_mode()
    def run_chunk(self, session: Cosmos3WorldSession, camera: list[list[str]] | None,
                  prompt: str | None = None, refresh_kv: bool = False) -> ChunkRunOutput:
        """One chunk (no KV cache exists, so `refresh_kv` has nothing to refresh)."""
        start = time.perf_counter()
        first = session.next_chunk == 0
        steps = self.upsampling * session.settings.frames_per_block
        check_camera(camera, steps + 1)
        entries = (camera or [])[1:] if first else camera
        if prompt is not None:
            session.prompt = prompt
        frames = to_uint8(self.forward(session, pose_deltas(entries, steps)))
        session.image = Image.fromarray(frames[-1])
        emitted = frames if first else frames[1:]
        session.next_chunk += 1
        elapsed_ms = (time.perf_counter() - start) * 1000
        return ChunkRunOutput(np.ascontiguousarray(emitted).tobytes(), len(emitted), elapsed_ms,
                              None, None, dit_ms=elapsed_ms)

    def forward(self, session: Cosmos3WorldSession, poses: torch.Tensor) -> np.ndarray:
        """One `Cosmos3OmniPipeline.__call__` from the session's image: float frames [T,H,W,3]."""
        from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition

        s = session.settings
        action = CosmosActionCondition(
            mode="forward_dynamics", chunk_size=len(poses), domain_name=DOMAIN,
            resolution_tier=session.tier, raw_actions=poses, image=session.image,
            view_point=self.defaults.view_point)
        out = self.model(prompt=session.prompt, negative_prompt=s.negative_prompt or None,
                         action=action, fps=float(self.defaults.default_fps),
                         num_inference_steps=s.num_inference_steps,
                         guidance_scale=s.guidance_scale, generator=session.generator,
                         output_type="np", enable_safety_check=False)
        return np.asarray(out.video)
