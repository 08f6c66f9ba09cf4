"""Runs batches of a Wan diffusers video/image pipeline one denoising step at a time.

Mirrors `WanPipeline.__call__` (diffusers 0.42) with the loop turned inside out: `prepare()`
encodes prompts and samples latents, `denoise_step()` runs one step for the whole batch,
`decode()` turns one row's latents into frames. The same seed gives the same output as calling
the pipeline directly (a unit test checks it). Image conditioning:

- one frame (image edits): SDEdit — the input image's latents, noised to the `strength`
  level, replace pure noise and denoising starts part-way;
- several frames (image-to-video): the first latent frame is pinned to the image's latents
  (re-noised to the current noise level before every step), the rest is generated.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from worldserve.errors import InvalidRequest
from worldserve.ipc.capabilities import GenerationDefaults
from worldserve.ipc.messages import GenerationParams
from worldserve.levers.diffusers_admin import DiffusersAdminOps
from worldserve.levers.lora import LoraAdapters
from worldserve.levers.speed import NATIVE, CompileTimer, apply_attention_backend, compile_blocks
from worldserve.levers.yielding import BlockYieldOps
from worldserve.models.common import count_parameters
from worldserve.models.dev import checkpoint_defaults
from worldserve.models.types import ModelLoadError, RowExtras, RunnerFeatures
from worldserve.models.wan.family import DEFAULTS, DEV_DEFAULTS, FAMILY
from worldserve.models.wan.loader import load_pipeline

DEFAULT_MAX_SEQUENCE_LENGTH = 512
MAX_CONDITION_IMAGES = 4


@dataclass
class BatchState:
    """Tensors of one running batch. Row r belongs to `row_owner[r]` (a request id)."""

    row_owner: list[str]
    params: GenerationParams
    prompt_embeds: torch.Tensor  # (B, L, D)
    negative_embeds: torch.Tensor | None  # (B, L, D) when classifier-free guidance is on
    latents: torch.Tensor  # (B, C, T_latent, h, w), float32
    scheduler: Any
    timesteps: torch.Tensor
    step_index: int = 0
    start_index: int = 0
    # image-to-video: (B, C, 1, h, w) image latents and the noise they are re-noised with
    first_frame: torch.Tensor | None = None
    first_frame_noise: torch.Tensor | None = None

    @property
    def num_steps(self) -> int:
        return len(self.timesteps)

    @property
    def done_denoising(self) -> bool:
        return self.step_index >= self.num_steps

    def keep_rows(self, keep: list[int]) -> None:
        """Drop every row not in `keep` (a cancelled request leaves the batch)."""
        index = torch.tensor(keep, dtype=torch.long)
        self.row_owner = [self.row_owner[i] for i in keep]
        self.prompt_embeds = self.prompt_embeds.index_select(0, index)
        if self.negative_embeds is not None:
            self.negative_embeds = self.negative_embeds.index_select(0, index)
        self.latents = self.latents.index_select(0, index)
        if self.first_frame is not None:
            self.first_frame = self.first_frame.index_select(0, index)
            self.first_frame_noise = self.first_frame_noise.index_select(0, index)


def load_runner(model_dir: Path, *, dtype: str = "float32", device: str = "cpu",
                safety_checker: bool = False) -> DiffusionRunner:
    """The registry's generation loader for a Wan diffusers directory (Wan pipelines have no
    safety checker, so the option is refused rather than silently ignored)."""
    if safety_checker:
        raise ModelLoadError(f"{model_dir}: stages.generation.safety_checker applies to Cosmos3 "
                             "checkpoints; Wan pipelines have none (set it to false)")
    return DiffusionRunner(load_pipeline(model_dir, dtype, device),
                           defaults=checkpoint_defaults(model_dir, DEFAULTS, DEV_DEFAULTS))


class DiffusionRunner(DiffusersAdminOps, BlockYieldOps):
    """Owns the pipeline; stateless between batches except for the model weights.

    Satisfies the generation runner contract (engines/generation/contract.py), with the
    optional LoRA / weights / memory capabilities of `DiffusersAdminOps` and the block yield
    points of a colocated stage (`BlockYieldOps`).
    """

    # Rows of one forward: no limit of its own (the stage's `max_batch_size` decides).
    max_batch_size: int | None = None

    def __init__(self, pipe: Any, defaults: GenerationDefaults = DEFAULTS) -> None:
        self.pipe = pipe
        self.features = RunnerFeatures(family=FAMILY.name, defaults=defaults)
        self.num_params = count_parameters(pipe)
        self.device = pipe._execution_device
        transformer = pipe.transformer if pipe.transformer is not None else pipe.transformer_2
        self.transformer_dtype = transformer.dtype
        self.in_channels = transformer.config.in_channels
        patch = transformer.config.patch_size
        self.spatial_stride = pipe.vae_scale_factor_spatial
        self.temporal_stride = pipe.vae_scale_factor_temporal
        self.size_multiple = self.spatial_stride * max(patch[1], patch[2])
        self.boundary_ratio = pipe.config.get("boundary_ratio") if hasattr(pipe, "config") else None
        self.expand_timesteps = bool(getattr(pipe.config, "expand_timesteps", False))
        vae_cfg = pipe.vae.config
        self.latents_mean = torch.tensor(vae_cfg.latents_mean).view(1, vae_cfg.z_dim, 1, 1, 1)
        self.latents_std = torch.tensor(vae_cfg.latents_std).view(1, vae_cfg.z_dim, 1, 1, 1)
        self.lora = LoraAdapters(pipe)
        self.attention_backend = NATIVE
        self.compile_timer = CompileTimer(False)

    # ------------------------------------------------------------------ admin (optional contract)

    def describe(self) -> dict[str, Any]:
        timer = self.compile_timer
        return {"family": FAMILY.name, "pipeline": type(self.pipe).__name__,
                "dtype": str(self.transformer_dtype).removeprefix("torch."),
                "device": str(self.device), "lora_supported": True,
                "lora": self.lora.describe(),
                "speed": {"attention_backend": self.attention_backend,
                          "compile": timer.pending or timer.seconds is not None,
                          "compile_s": timer.seconds}}

    def configure_speed(self, attention_backend: str = NATIVE, compile: bool = False,
                        understanding_kv_reuse: bool = False,
                        compile_backend: str | None = None) -> None:
        """stages.generation.attention_backend / compile on every expert (Wan 2.2 A14B: the
        second expert compiles when the schedule first reaches it)."""
        del understanding_kv_reuse  # Cosmos3 only: Wan has no understanding stream
        experts = [t for t in (self.pipe.transformer, getattr(self.pipe, "transformer_2", None))
                   if t is not None]
        apply_attention_backend(experts, attention_backend, self.device, self.transformer_dtype)
        self.attention_backend = attention_backend
        if compile:
            compile_blocks(experts, backend=compile_backend)
            self.compile_timer = CompileTimer(True)

    # ------------------------------------------------------------------ checks

    def snap_frames(self, num_frames: int) -> int:
        """Wan needs 4k+1 frames (temporal VAE stride); snap down like the pipeline does."""
        if num_frames % self.temporal_stride != 1:
            num_frames = num_frames // self.temporal_stride * self.temporal_stride + 1
        return max(num_frames, 1)

    def check(self, params: GenerationParams) -> None:
        """Refuse what the model cannot run, with a message naming the field (-> 400)."""
        m = self.size_multiple
        for name in ("width", "height"):
            value = getattr(params, name)
            if value <= 0 or value % m:
                raise InvalidRequest(f"{name} must be a positive multiple of {m} for this model "
                                     f"(got {value})", param=name)
        if params.num_inference_steps <= 0:
            raise InvalidRequest("num_inference_steps must be positive",
                                 param="num_inference_steps")
        if not params.seeds:
            raise InvalidRequest("at least one output is required", param="n")
        if len(params.condition_images) > MAX_CONDITION_IMAGES:
            raise InvalidRequest(
                f"this model accepts at most {MAX_CONDITION_IMAGES} input image(s)", param="image")
        if not 0.0 < params.strength <= 1.0:
            raise InvalidRequest("strength must be in (0, 1]", param="strength")

    # ------------------------------------------------------------------ phases

    @torch.inference_mode()
    def prepare(self, row_owner: list[str], rows: list[GenerationParams],
                seeds: list[int]) -> BatchState:
        """Encode prompts and sample the initial latents of one batch (rows share a batch key)."""
        params = rows[0]
        cfg = params.guidance_scale > 1.0
        max_len = params.max_sequence_length or DEFAULT_MAX_SEQUENCE_LENGTH
        prompt_embeds, negative_embeds = self.pipe.encode_prompt(
            prompt=[r.prompt for r in rows], negative_prompt=[r.negative_prompt for r in rows],
            do_classifier_free_guidance=cfg, num_videos_per_prompt=1,
            max_sequence_length=max_len, device=self.device)
        scheduler = type(self.pipe.scheduler).from_config(self.pipe.scheduler.config)
        scheduler.set_timesteps(params.num_inference_steps, device=self.device)
        latents = torch.cat([self._noise(params, seed) for seed in seeds])
        state = BatchState(
            row_owner=row_owner, params=params,
            prompt_embeds=prompt_embeds.to(self.transformer_dtype),
            negative_embeds=negative_embeds.to(self.transformer_dtype) if cfg else None,
            latents=latents, scheduler=scheduler, timesteps=scheduler.timesteps)
        if params.condition_images:
            self._condition(state, params)
        else:
            scheduler.set_begin_index(0)
        return state

    def _noise(self, params: GenerationParams, seed: int) -> torch.Tensor:
        """Initial noise of one row, exactly as the pipeline samples it for this seed."""
        generator = torch.Generator(device="cpu").manual_seed(seed)
        return self.pipe.prepare_latents(1, self.in_channels, params.height, params.width,
                                         params.num_frames, torch.float32, self.device, generator)

    def _condition(self, state: BatchState, params: GenerationParams) -> None:
        image_latents = self.encode_images(params.condition_images, params.width, params.height)
        image_latents = image_latents.expand(state.latents.shape[0], -1, -1, -1, -1)
        if params.num_frames == 1:  # SDEdit
            total = params.num_inference_steps
            start = min(total - 1, int(round(total * (1.0 - params.strength))))
            state.timesteps = state.scheduler.timesteps[start:]
            state.scheduler.set_begin_index(start)
            t0 = state.timesteps[:1].expand(state.latents.shape[0])
            state.latents = state.scheduler.scale_noise(image_latents, t0, state.latents)
            state.start_index = start
        else:  # pin the first latent frame
            state.scheduler.set_begin_index(0)
            state.first_frame = image_latents
            state.first_frame_noise = state.latents[:, :, :1].clone()

    @torch.inference_mode()
    def encode_images(self, images: list[bytes], width: int, height: int) -> torch.Tensor:
        """Mean normalised VAE latents of the input images: (1, C, 1, h, w)."""
        pixels = []
        for data in images:
            img = Image.open(io.BytesIO(data)).convert("RGB").resize((width, height), Image.BICUBIC)
            arr = torch.from_numpy(np.asarray(img, dtype=np.float32) / 127.5 - 1.0)
            pixels.append(arr.permute(2, 0, 1).unsqueeze(1))  # (3, 1, H, W)
        video = torch.stack(pixels).to(self.device, self.pipe.vae.dtype)  # (N, 3, 1, H, W)
        dist = self.pipe.vae.encode(video).latent_dist
        z = dist.mode().float()
        z = (z - self.latents_mean) / self.latents_std
        return z.mean(dim=0, keepdim=True)

    @torch.inference_mode()
    def denoise_step(self, state: BatchState) -> None:
        """One denoising step of every row of the batch."""
        i = state.step_index
        t = state.timesteps[i]
        model, guidance = self._model_for(t, state.params)
        if state.first_frame is not None:
            sigma = state.scheduler.sigmas[state.start_index + i]
            noised = (1 - sigma) * state.first_frame + sigma * state.first_frame_noise
            state.latents[:, :, :1] = noised
        x = state.latents.to(self.transformer_dtype)
        if self.expand_timesteps:
            h, w = x.shape[-2:]
            per_token = torch.full((x.shape[2], h // 2, w // 2), float(t)).flatten()
            timestep = per_token.unsqueeze(0).expand(x.shape[0], -1)
        else:
            timestep = t.expand(x.shape[0])
        with self.compile_timer:
            noise_pred = model(hidden_states=x, timestep=timestep,
                               encoder_hidden_states=state.prompt_embeds, return_dict=False)[0]
        if state.negative_embeds is not None:
            uncond = model(hidden_states=x, timestep=timestep,
                           encoder_hidden_states=state.negative_embeds, return_dict=False)[0]
            noise_pred = uncond + guidance * (noise_pred - uncond)
        state.latents = state.scheduler.step(noise_pred, t, state.latents, return_dict=False)[0]
        state.step_index += 1
        if state.done_denoising and state.first_frame is not None:
            state.latents[:, :, :1] = state.first_frame

    def _model_for(self, t: torch.Tensor, params: GenerationParams) -> tuple[Any, float]:
        """Wan 2.2 A14B: the high-noise expert above the boundary, the low-noise one below."""
        if self.boundary_ratio is None or getattr(self.pipe, "transformer_2", None) is None:
            return self.pipe.transformer, params.guidance_scale
        boundary = self.boundary_ratio * self.pipe.scheduler.config.num_train_timesteps
        if t >= boundary:
            return self.pipe.transformer, params.guidance_scale
        return self.pipe.transformer_2, params.guidance_scale_2 or params.guidance_scale

    @torch.inference_mode()
    def decode(self, state: BatchState, row: int) -> np.ndarray:
        """Frames of one row as floats in [0, 1], (T, H, W, 3), like the pipeline's "np" output."""
        latents = state.latents[row:row + 1].to(self.pipe.vae.dtype)
        latents = latents * self.latents_std.to(latents) + self.latents_mean.to(latents)
        video = self.pipe.vae.decode(latents, return_dict=False)[0]
        return self.pipe.video_processor.postprocess_video(video, output_type="np")[0]

    def extras(self, state: BatchState, row: int) -> RowExtras | None:
        """Wan produces frames only."""
        return None
