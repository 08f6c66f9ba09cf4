"""Runs Cosmos3 (`Cosmos3OmniPipeline`, diffusers 0.42) one denoising step at a time.

`Cosmos3OmniPipeline.__call__` with its loop turned inside out: `prepare()` does everything
`__call__` does before the loop (input checks, prompt templates and tokens, the static
sequence packs, initial noise, conditioning latents, timesteps), `denoise_step()` runs one
iteration of the loop body (cond and uncond forwards, CFG, one scheduler step per modality),
`decode()` runs the VAE (and `extras()` the sound decoder and the action slice). Each request
row owns its schedulers (`__call__` mutates `pipe.scheduler`), so rows of different requests
interleave step by step and each equals its solo `__call__` (tests/unit/models/test_cosmos3.py).

The Cosmos3 forward has no batch axis (one packed sequence per sample, CFG as two forwards),
so `max_batch_size` is 1: concurrent requests interleave, they never share a forward.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import torch

from worldserve.errors import InvalidRequest
from worldserve.ipc.messages import GenerationParams
from worldserve.ipc.rules import check_generation
from worldserve.levers import shared
from worldserve.levers.diffusers_admin import DiffusersAdminOps, LoraAdapters
from worldserve.levers.speed import NATIVE, CompileTimer, apply_attention_backend, compile_blocks
from worldserve.levers.step_cache import METHODS, StepCache, StepCacheSettings
from worldserve.levers.yielding import BlockYieldOps
from worldserve.models.common import count_parameters
from worldserve.models.cosmos3 import checks, inputs
from worldserve.models.cosmos3.family import DEFAULTS, DEV_DEFAULTS, FAMILY
from worldserve.models.cosmos3.loader import load_pipeline
from worldserve.models.dev import checkpoint_defaults
from worldserve.models.types import RowExtras, RunnerFeatures, StepCacheStats
from worldserve.models.wan.vae import TilingOptions, WanDecodeJob, configure_tiling

SAMPLING_DTYPE = torch.float32
log = logging.getLogger("worldserve.models.cosmos3")


@dataclass
class RowState:
    """Everything one output row needs between steps (one `__call__`'s locals)."""

    latents: torch.Tensor
    sound_latents: torch.Tensor | None
    action_latents: torch.Tensor | None
    cond: dict[str, Any]
    uncond: dict[str, Any]
    vision_mask: torch.Tensor
    sound_mask: torch.Tensor | None
    action_mask: torch.Tensor | None
    action_domain_id: int | None
    raw_action_dim: int | None
    action_mode: str | None
    scheduler: Any
    sound_scheduler: Any
    action_scheduler: Any
    timesteps: torch.Tensor
    mixed_precision: Any
    device: Any  # the pipeline's execution device, resolved once per row
    decode_job: WanDecodeJob | None = None  # a chunked VAE decode under way (decode_chunk)
    # "cond" / "uncond" -> that prompt's recorded understanding K/V (models/cosmos3/kv_reuse.py)
    understanding_kv: dict[str, Any] = field(default_factory=dict)
    # Step caching (levers/step_cache.py): this row's cache context prefix, whether it caches,
    # and its transformer forwards so far (skipped: cached work reused).
    cache_key: str = ""
    step_cache: bool = False
    num_forwards: int = 0
    num_forwards_skipped: int = 0

    @property
    def cache_names(self) -> list[str]:
        return [f"{self.cache_key}/cond", f"{self.cache_key}/uncond"]


@dataclass
class Cosmos3Batch:
    """The rows of one request (one row per seed); every row advances once per step."""

    row_owner: list[str]
    rows: list[RowState]
    guidance_scale: float
    step_index: int = 0
    num_timesteps: int = 0
    extras_cache: dict[int, RowExtras] = field(default_factory=dict)
    # frees a row's step-cache state (finished or cancelled rows); None: no step cache
    release: Callable[[RowState], None] | None = None

    @property
    def num_steps(self) -> int:
        return self.num_timesteps

    @property
    def done_denoising(self) -> bool:
        return self.step_index >= self.num_timesteps

    def keep_rows(self, keep: list[int]) -> None:
        if self.release is not None:
            for i, row in enumerate(self.rows):
                if i not in keep:
                    self.release(row)
        self.row_owner = [self.row_owner[i] for i in keep]
        self.rows = [self.rows[i] for i in keep]


def load_runner(model_dir: Path, *, dtype: str = "float32", device: str = "cpu",
                safety_checker: bool = False, fp8_compute: str = "auto") -> Cosmos3Runner:
    """The registry's generation loader for a Cosmos3 directory. The transformer is published
    for a reasoner loaded later in this process (a colocated stage shares its weights)."""
    pipe = load_pipeline(model_dir, dtype, device, safety_checker=safety_checker,
                         fp8_compute=fp8_compute)
    shared.publish(model_dir, shared.GENERATOR_TRANSFORMER, pipe.transformer)
    return Cosmos3Runner(pipe, Path(model_dir))


class Cosmos3Runner(DiffusersAdminOps, BlockYieldOps):
    """Owns the pipeline; satisfies the generation runner contract (engines/generation), with
    the optional LoRA / weights / memory capabilities of `DiffusersAdminOps` (the pipeline has
    no LoRA loader: adapters load through the transformer's `load_lora_adapter`), and yield
    points between its transformer blocks for a colocated reasoner (`BlockYieldOps`)."""

    max_batch_size: int | None = 1  # no batch axis: interleave only

    def __init__(self, pipe: Any, model_dir: Path | None = None) -> None:
        self.pipe = pipe
        self.model_dir = model_dir
        self.num_params = count_parameters(pipe)
        self.size_multiple = int(pipe.vae.config.scale_factor_spatial)
        self.temporal_stride = int(pipe.vae.config.scale_factor_temporal)
        config = pipe.transformer.config
        self.supports_sound = pipe.sound_tokenizer is not None and bool(config.sound_gen)
        self.supports_actions = bool(config.action_gen)
        self.padded_action_dim = int(config.action_dim) if self.supports_actions else None
        self.sample_rate = (int(pipe.sound_tokenizer.config.sampling_rate)
                            if pipe.sound_tokenizer is not None else None)
        self.features = self._features()
        self.declaration = checks.declaration(self)
        self.device = pipe._get_execution_device()
        self.lora = LoraAdapters(pipe)
        self.attention_backend = NATIVE
        self.compile_timer = CompileTimer(False)
        self.kv_reuse: Any = None  # an UnderstandingKVReuse once configured
        self.step_cache: StepCache | None = None

    def enable_step_cache(self, settings: StepCacheSettings) -> None:
        """Install the cache hooks (at startup); rows cache only when their request asks."""
        if self.step_cache is not None:
            raise RuntimeError("step caching is already enabled on this runner")
        self.step_cache = StepCache(self.pipe.transformer, settings)
        self.declaration = msgspec.structs.replace(self.declaration, step_cache=settings.method)

    def describe(self) -> dict[str, Any]:
        """GET /admin/model_info facts."""
        return {"family": FAMILY.name, "pipeline": type(self.pipe).__name__,
                "dtype": str(self.pipe.transformer.dtype).removeprefix("torch."),
                "device": str(self.device), "lora_supported": True,
                "lora": self.lora.describe(), "sound": self.supports_sound,
                "action_generation": self.supports_actions, "speed": self.describe_speed(),
                "step_cache": (self.step_cache.settings.method if self.step_cache is not None
                               else None)}

    def describe_speed(self) -> dict[str, Any]:
        """The speed levers in force (part of /admin/model_info)."""
        timer = self.compile_timer
        return {"attention_backend": self.attention_backend,
                "compile": timer.pending or timer.seconds is not None,
                "compile_s": round(timer.seconds, 3) if timer.seconds is not None else None,
                "understanding_kv_reuse": self.kv_reuse is not None}

    def configure_speed(self, attention_backend: str = NATIVE, compile: bool = False,
                        understanding_kv_reuse: bool = False,
                        compile_backend: str | None = None) -> None:
        """Applied once after loading, before warmup (the stage config's fields). The reuse
        processors go in first so that the backend is set on them too."""
        transformer = self.pipe.transformer
        if understanding_kv_reuse:
            from worldserve.models.cosmos3.kv_reuse import UnderstandingKVReuse

            if transformer._cp_shard_fn is not None or transformer._cp_gather_fn is not None:
                log.info("understanding K/V reuse off: sequence parallelism owns the seams")
            else:
                self.kv_reuse = UnderstandingKVReuse()
                self.kv_reuse.install(transformer)
        apply_attention_backend([transformer], attention_backend, self.device,
                                transformer.dtype, gqa=True)
        self.attention_backend = attention_backend
        if compile:
            compile_blocks([transformer], backend=compile_backend)
            self.compile_timer = CompileTimer(True)

    def _features(self) -> RunnerFeatures:
        from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import (
            _ACTION_RESOLUTION_BINS,
            _EMBODIMENT_TO_DOMAIN_ID,
            _EMBODIMENT_TO_RAW_ACTION_DIM,
        )

        domains = None
        if self.supports_actions:  # the domains whose width fits the model's padded width
            domains = {name: width for name, width in _EMBODIMENT_TO_RAW_ACTION_DIM.items()
                       if width <= (self.padded_action_dim or 0)}
        defaults = (checkpoint_defaults(self.model_dir, DEFAULTS, DEV_DEFAULTS)
                    if self.model_dir is not None else DEFAULTS)
        return RunnerFeatures(
            family=FAMILY.name, defaults=defaults, image_edits=False, exact_num_frames=True,
            sound=self.supports_sound,
            sound_sample_rate=self.sample_rate if self.supports_sound else None,
            video_conditioning=True, action_generation=self.supports_actions,
            flow_shift="flow_shift" in self.pipe.scheduler.config,
            padded_action_dim=self.padded_action_dim, action_domains=domains,
            action_domain_ids=({name: _EMBODIMENT_TO_DOMAIN_ID[name] for name in domains}
                               if domains is not None else None),
            action_api="world_model" if self.supports_actions else None,
            step_cache_methods=METHODS,
            action_resolution_tiers=tuple(sorted(int(k) for k in _ACTION_RESOLUTION_BINS)))

    # ------------------------------------------------------------------ checks

    def snap_frames(self, num_frames: int) -> int:
        """Cosmos3 takes any count; the api refuses counts that are not 4k+1 (spec table)."""
        return max(1, num_frames)

    def check(self, params: GenerationParams) -> None:
        """The declared rules of a request (the api checked them already; a backstop here at
        submission, -> 400 before a job exists)."""
        check_generation(params, self.declaration)

    # ------------------------------------------------------------------ phases

    @torch.no_grad()
    def prepare(self, row_owner: list[str], rows: list[GenerationParams],
                seeds: list[int]) -> Cosmos3Batch:
        states = [self._prepare_row(params, seed) for params, seed in zip(rows, seeds)]
        for state, params in zip(states, rows):
            self._attach_cache(state, bool(params.step_cache))
        return Cosmos3Batch(row_owner=row_owner, rows=states,
                            guidance_scale=rows[0].guidance_scale,
                            num_timesteps=len(states[0].timesteps),
                            release=self._release_row if self.step_cache is not None else None)

    def _attach_cache(self, row: RowState, cached: bool) -> None:
        """Give a row its own cache context names; their state goes when the row does."""
        cache = self.step_cache
        if cache is None:
            if cached:
                raise InvalidRequest("step caching is not enabled on this server",
                                     param="enable_teacache")
            return
        row.cache_key, row.step_cache = cache.new_row_key(), cached
        weakref.finalize(row, cache.release, row.cache_names)  # a batch dropped on failure

    def _release_row(self, row: RowState) -> None:
        if self.step_cache is not None:
            self.step_cache.release(row.cache_names)

    def step_cache_stats(self, state: Cosmos3Batch, row: int) -> StepCacheStats | None:
        """A row's transformer forwards and how many reused cached work (None: not cached)."""
        r = state.rows[row]
        if not r.step_cache or self.step_cache is None:
            return None
        return StepCacheStats(method=self.step_cache.settings.method,
                              num_forwards=r.num_forwards,
                              num_forwards_skipped=r.num_forwards_skipped)

    def _prepare_row(self, params: GenerationParams, seed: int) -> RowState:
        """`__call__` steps 1-6 for one sample (same calls, same order)."""
        pipe = self.pipe
        action = inputs.action_condition(params.action, params)
        image, video = (None, None) if action is not None else inputs.conditioning(params)
        num_frames, height, width = ((None, None, None) if action is not None
                                     else (params.num_frames, params.height, params.width))
        indexes = tuple(params.condition_frame_indexes_vision or (0, 1))
        negative = params.negative_prompt
        pipe.check_inputs(params.prompt, negative, image, height, width, num_frames,
                          params.guidance_scale, params.generate_sound, ["latents"], action,
                          video=video, condition_frame_indexes_vision=indexes)
        if action is not None:
            num_frames, height, width = self._action_canvas(action)
        fps = float(params.fps or 24.0)
        device = pipe._get_execution_device()
        self._check_text_safety(params.prompt, device)
        cond_ids, uncond_ids = pipe.tokenize_prompt(
            params.prompt, negative, num_frames=num_frames, height=height, width=width, fps=fps,
            use_system_prompt=None, add_resolution_template=True, add_duration_template=True,
            action_mode=action.mode if action is not None else None,
            action_view_point=action.view_point if action is not None else None)
        cond_text = pipe._prepare_text_segment(cond_ids, device=device)
        uncond_text = pipe._prepare_text_segment(uncond_ids, device=device)
        generator = torch.Generator("cpu").manual_seed(seed)
        (latents, sound_latents, action_latents, fps_vision, fps_sound, vision_mask, sound_mask,
         action_mask, domain_id, _image_size, raw_dim, action_indexes) = pipe.prepare_latents(
            image=image, video=video, condition_frame_indexes_vision=indexes,
            condition_video_keep=params.condition_video_keep or "first", num_frames=num_frames,
            height=height, width=width, fps=fps, latents=None, sound_latents=None,
            action_latents=None, generator=generator, device=device, dtype=SAMPLING_DTYPE,
            enable_sound=params.generate_sound, action=action)
        condition_indexes = [int(i.item()) for i in
                             torch.nonzero(vision_mask[:, 0, 0] > 0, as_tuple=False).flatten()]
        modality = dict(latents=latents, sound_latents=sound_latents,
                        action_latents=action_latents, fps_vision=fps_vision,
                        fps_sound=fps_sound, condition_indexes=condition_indexes,
                        action_indexes=action_indexes, device=device)
        cond = self._pack(cond_text, **modality)
        uncond = self._pack(uncond_text, **modality)
        scheduler, timesteps = self._scheduler(params.num_inference_steps, device,
                                               params.flow_shift)
        return RowState(
            latents=latents, sound_latents=sound_latents, action_latents=action_latents,
            cond=cond, uncond=uncond, vision_mask=vision_mask, sound_mask=sound_mask,
            action_mask=action_mask, action_domain_id=domain_id, raw_action_dim=raw_dim,
            action_mode=action.mode if action is not None else None, scheduler=scheduler,
            sound_scheduler=copy.deepcopy(scheduler) if sound_latents is not None else None,
            action_scheduler=copy.deepcopy(scheduler) if action_latents is not None else None,
            timesteps=timesteps, mixed_precision=self._mixed_precision(), device=device)

    def _action_canvas(self, action: Any) -> tuple[int, int, int]:
        """Frames and the padded canvas of an action run, as `__call__` resolves them."""
        from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import _ACTION_RESOLUTION_BINS
        from diffusers.video_processor import VideoProcessor

        clip = [action.image] if action.image is not None else action.video
        probe = self.pipe.video_processor.preprocess_video(clip)
        height, width = VideoProcessor.classify_height_width_bin(
            int(probe.shape[-2]), int(probe.shape[-1]),
            ratios=_ACTION_RESOLUTION_BINS[str(action.resolution_tier)])
        return action.chunk_size + 1, height, width

    def _check_text_safety(self, prompt: str, device: Any) -> None:
        checker = self.pipe.safety_checker
        if checker is None:
            return
        checker.to(device)
        try:
            if not checker.check_text_safety(prompt):
                raise InvalidRequest("Cosmos Guardrail detected unsafe text in the prompt",
                                     param="prompt")
        finally:
            checker.to("cpu")

    def _pack(self, text: dict[str, Any], *, latents: torch.Tensor,
              sound_latents: torch.Tensor | None, action_latents: torch.Tensor | None,
              fps_vision: Any, fps_sound: Any, condition_indexes: list[int],
              action_indexes: Any, device: Any) -> dict[str, Any]:
        """`__call__` step 5 for one prompt: the static vision / sound / action segments."""
        pipe = self.pipe
        offset = text["vision_start_temporal_offset"]
        vision = pipe._prepare_vision_segment(
            input_vision_tokens=latents, has_image_condition=bool(condition_indexes),
            mrope_offset=offset, vision_fps=fps_vision, curr=text["und_len"], device=device,
            condition_frame_indexes=condition_indexes)
        sound: dict[str, Any] = {}
        if sound_latents is not None:
            sound = pipe._prepare_sound_segment(
                input_sound_tokens=sound_latents, mrope_offset=offset, sound_fps=fps_sound,
                curr=text["und_len"] + vision["num_vision_tokens"], device=device)
        action: dict[str, Any] = {}
        if action_latents is not None:
            action = pipe._prepare_action_segment(
                input_action_tokens=action_latents, condition_frame_indexes=action_indexes,
                mrope_offset=offset, action_fps=fps_vision,
                curr=text["und_len"] + vision["num_vision_tokens"] + sound.get("sound_len", 0),
                device=device)
        mrope = [text["text_mrope_ids"], vision["vision_mrope_ids"]]
        if sound:
            mrope.append(sound["sound_mrope_ids"])
        if action:
            mrope.append(action["action_mrope_ids"])
        return {**text, **vision, **sound, **action,
                "position_ids": torch.cat(mrope, dim=1),
                "sequence_length": text["und_len"] + vision["num_vision_tokens"]
                + sound.get("sound_len", 0) + action.get("action_len", 0)}

    def _scheduler(self, num_steps: int, device: Any,
                   flow_shift: float | None = None) -> tuple[Any, torch.Tensor]:
        """A fresh copy of the pipeline's scheduler with its timesteps set (`__call__` step 6);
        a request's `flow_shift` replaces the configured one (the NIM's per-request field)."""
        base = self.pipe.scheduler
        shift = {"flow_shift": flow_shift} if flow_shift is not None else {}
        scheduler = type(base).from_config(base.config, **shift)
        if self.pipe.config.use_native_flow_schedule:
            sigmas = np.linspace(1.0 - 1.0 / scheduler.config.num_train_timesteps, 0.0,
                                 num_steps + 1)[:-1]
            scheduler.set_timesteps(num_steps, device=device, sigmas=sigmas)
        else:
            scheduler.set_timesteps(num_steps, device=device)
        return scheduler, scheduler.timesteps

    def _mixed_precision(self) -> Any:
        from diffusers.pipelines.cosmos.mixed_precision import Cosmos3MixedPrecisionConfig

        return Cosmos3MixedPrecisionConfig.resolve(self.pipe.transformer)

    @torch.no_grad()
    def denoise_step(self, state: Cosmos3Batch) -> None:
        """One iteration of `__call__`'s loop for every row."""
        for row in state.rows:
            self._step_row(row, state.step_index, state.guidance_scale)
        state.step_index += 1
        if state.done_denoising:
            for row in state.rows:
                self._reset_precision(row)
                row.understanding_kv.clear()  # the recorded K/V is of no use past the last step
                self._release_row(row)

    def _step_row(self, row: RowState, i: int, guidance: float) -> None:
        from diffusers.pipelines.cosmos.mixed_precision import apply_cosmos3_mixed_precision_step

        pipe = self.pipe
        transformer = pipe.transformer
        apply_cosmos3_mixed_precision_step(transformer, row.mixed_precision, i,
                                           len(row.timesteps), trace=None)
        t = row.timesteps[i]
        sigma = float(row.scheduler.sigmas[i])
        device, dtype = row.device, transformer.dtype
        tokens = {
            "vision": row.latents.to(device=device, dtype=dtype),
            "sound": (row.sound_latents.to(device=device, dtype=dtype)
                      if row.sound_latents is not None else None),
            "action": (row.action_latents.to(device=device, dtype=dtype)
                       if row.action_latents is not None else None),
        }
        cond, uncond = self._guided_velocities(row, tokens, t, i, sigma, guidance != 1.0)
        velocity = [_combine(c, u, guidance) for c, u in
                    zip(cond, uncond if uncond is not None else (None, None, None))]
        row.latents = row.scheduler.step(velocity[0].unsqueeze(0), t, row.latents.unsqueeze(0),
                                         return_dict=False)[0].squeeze(0)
        if row.sound_scheduler is not None and velocity[1] is not None:
            row.sound_latents = row.sound_scheduler.step(
                velocity[1].unsqueeze(0), t, row.sound_latents.unsqueeze(0),
                return_dict=False)[0].squeeze(0)
        noisy_action = (row.action_mask is not None
                        and row.action_mask.sum() < row.action_mask.numel())
        if row.action_scheduler is not None and noisy_action and velocity[2] is not None:
            row.action_latents = row.action_scheduler.step(
                velocity[2].unsqueeze(0), t, row.action_latents.unsqueeze(0),
                return_dict=False)[0].squeeze(0)
            if row.raw_action_dim is not None:
                row.action_latents[:, row.raw_action_dim:] = 0

    def _guided_velocities(self, row: RowState, tokens: dict[str, Any], t: torch.Tensor,
                           i: int, sigma: float, cfg: bool) -> tuple[list[Any], list[Any] | None]:
        """The cond forward's velocities and, with CFG, the uncond one's (a rank group splits
        them: models/cosmos3/parallel.py)."""
        cond = self._velocities(row, row.cond, tokens, t, i, sigma, "cond")
        uncond = self._velocities(row, row.uncond, tokens, t, i, sigma, "uncond") if cfg else None
        return cond, uncond

    def _velocities(self, row: RowState, packed: dict[str, Any], tokens: dict[str, Any],
                    t: torch.Tensor, i: int, sigma: float, name: str) -> list[Any]:
        """One forward (cond or uncond) and its masked velocities, as float32."""
        pipe = self.pipe
        device = row.device
        timestep = t.item()
        vision_t = torch.full((packed["num_noisy_vision_tokens"],), timestep, device=device)
        sound_t = (torch.full((packed["sound_len"],), timestep, device=device)
                   if tokens["sound"] is not None else None)
        action_t = (torch.full((packed["num_noisy_action_tokens"],), timestep, device=device)
                    if tokens["action"] is not None else None)
        with self._forward(row, name, i, sigma), \
                self._understanding_kv(row, name, packed["und_len"]), self.compile_timer:
            preds = pipe.transformer(
                input_ids=packed["input_ids"], text_indexes=packed["text_indexes"],
                position_ids=packed["position_ids"], und_len=packed["und_len"],
                sequence_length=packed["sequence_length"],
                vision_tokens=[tokens["vision"]],
                vision_token_shapes=packed["vision_token_shapes"],
                vision_sequence_indexes=packed["vision_sequence_indexes"],
                vision_mse_loss_indexes=packed["vision_mse_loss_indexes"],
                vision_timesteps=vision_t,
                vision_noisy_frame_indexes=packed["vision_noisy_frame_indexes"],
                sound_tokens=[tokens["sound"]] if tokens["sound"] is not None else None,
                sound_token_shapes=packed.get("sound_token_shapes"),
                sound_sequence_indexes=packed.get("sound_sequence_indexes"),
                sound_mse_loss_indexes=packed.get("sound_mse_loss_indexes"),
                sound_timesteps=sound_t,
                sound_noisy_frame_indexes=packed.get("sound_noisy_frame_indexes"),
                action_tokens=[tokens["action"]] if tokens["action"] is not None else None,
                action_token_shapes=packed.get("action_token_shapes"),
                action_sequence_indexes=packed.get("action_sequence_indexes"),
                action_mse_loss_indexes=packed.get("action_mse_loss_indexes"),
                action_timesteps=action_t,
                action_noisy_frame_indexes=packed.get("action_noisy_frame_indexes"),
                action_domain_ids=([row.action_domain_id] if row.action_domain_id is not None
                                   else None),
                return_dict=False)
        preds_vision, preds_sound, preds_action = preds
        masked = pipe._mask_velocity_predictions(
            preds_vision, preds_sound, vision_condition_mask=[row.vision_mask],
            sound_condition_mask=[row.sound_mask] if row.sound_mask is not None else None,
            preds_action=preds_action,
            action_condition_mask=[row.action_mask] if row.action_mask is not None else None,
            raw_action_dim=row.raw_action_dim)
        return [v.float() if v is not None else None for v in masked]

    def _understanding_kv(self, row: RowState, name: str, und_len: int) -> Any:
        """Record (first step) or replay (later steps) this prompt's understanding K/V; a plain
        forward when reuse is off, under the FP8 step schedule (it may switch understanding
        linears between steps) or while the row caches steps (its hooks cache per-stream
        block outputs of the full length)."""
        if self.kv_reuse is None or row.mixed_precision.enabled or row.step_cache:
            return contextlib.nullcontext()
        from worldserve.models.cosmos3.kv_reuse import UnderstandingKV

        slot = row.understanding_kv.setdefault(name, UnderstandingKV())
        return self.kv_reuse.use(slot, und_len)

    @contextlib.contextmanager
    def _forward(self, row: RowState, name: str, i: int, sigma: float) -> Iterator[None]:
        """One transformer call under the row's own cache context (`<row key>/cond`), counted;
        a row that did not ask for caching runs as if no cache hook were installed."""
        transformer = self.pipe.transformer
        context = f"{row.cache_key}/{name}" if row.cache_key else name
        with transformer.cache_context(context, step_index=i, sigma=sigma,
                                       num_inference_steps=len(row.timesteps)):
            if self.step_cache is None:
                yield
                return
            with self.step_cache.forward(row.step_cache) as forward:
                yield
        row.num_forwards += 1
        row.num_forwards_skipped += int(forward.skipped)

    def _reset_precision(self, row: RowState) -> None:
        from diffusers.pipelines.cosmos.mixed_precision import reset_cosmos3_mixed_precision

        reset_cosmos3_mixed_precision(self.pipe.transformer, row.mixed_precision)

    def configure_vae(self, tiling: bool, tile_size: int | None = None,
                      tile_stride: int | None = None) -> dict[str, Any]:
        """stages.generation.vae_tiling: the Wan VAE's own spatial tiling (models/wan/vae.py)."""
        options = TilingOptions(tile_size, tile_stride) if tiling else None
        return configure_tiling(self.pipe.vae, options)

    @torch.no_grad()
    def decode(self, state: Cosmos3Batch, row: int) -> np.ndarray:
        """Frames of one row as floats in [0, 1], (T, H, W, 3): `__call__` step 8, "np"."""
        latents = state.rows[row].latents
        return self._postprocess(self._vae_decode(self._vae_latents(latents)), latents.dtype)

    @torch.no_grad()
    def decode_chunk(self, state: Cosmos3Batch, row: int, max_frames: int) -> np.ndarray | None:
        """`decode` spread over calls: up to `max_frames` latent frames (of one VAE tile) per
        call, the VAE's causal feature cache kept on the row in between (models/wan/vae.py);
        None until the last call, which returns what `decode` returns."""
        r = state.rows[row]
        if r.decode_job is None:
            r.decode_job = WanDecodeJob(self.pipe.vae, self._vae_latents(r.latents))
        if not r.decode_job.advance(max_frames):
            return None
        job, r.decode_job = r.decode_job, None
        return self._postprocess(job.result(), r.latents.dtype)

    def _vae_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Model latents -> the VAE's (un-normalised, in the VAE's dtype), as `__call__`."""
        pipe = self.pipe
        dtype = pipe.vae.dtype
        mean = pipe._vae_latents_mean.to(device=latents.device, dtype=dtype)
        inv_std = pipe._vae_latents_inv_std.to(device=latents.device, dtype=dtype)
        return latents.to(dtype) / inv_std.view(1, -1, 1, 1, 1) + mean.view(1, -1, 1, 1, 1)

    def _postprocess(self, decoded: torch.Tensor, in_dtype: torch.dtype) -> np.ndarray:
        pipe = self.pipe
        video = pipe.video_processor.postprocess_video(decoded.to(in_dtype), output_type="np")[0]
        if pipe.safety_checker is not None:
            video = pipe._apply_video_safety_check(video, output_type="np",
                                                   device=pipe._get_execution_device())
        return video

    def _vae_decode(self, z_raw: torch.Tensor) -> torch.Tensor:
        """(1, 3, T, H, W) in [-1, 1] (a rank group splits it: models/cosmos3/parallel.py).
        In a colocated process (a yield point set) the decode pauses at the yield point
        between latent frames, as the forward does between blocks; the same frames."""
        if self.yield_point is None:
            return self.pipe.vae.decode(z_raw).sample
        job = WanDecodeJob(self.pipe.vae, z_raw)
        while not job.advance(1):
            self.yield_point()
        return job.result()

    @torch.no_grad()
    def extras(self, state: Cosmos3Batch, row: int) -> RowExtras | None:
        """Sound (stereo waveform) and predicted actions of one finished row."""
        r = state.rows[row]
        audio = None
        if r.sound_latents is not None:
            audio = self.pipe.decode_sound(r.sound_latents).float().cpu().numpy()
        action = None
        if r.action_mode in ("policy", "inverse_dynamics") and r.action_latents is not None:
            values = r.action_latents
            if r.raw_action_dim is not None:
                values = values[:, :r.raw_action_dim]
            action = values.detach().float().cpu().numpy()
        if audio is None and action is None:
            return None
        return RowExtras(audio=audio, sample_rate=self.sample_rate if audio is not None else None,
                         action=action, action_mode=r.action_mode,
                         domain_id=_as_int(r.action_domain_id))

    # ------------------------------------------------------------------ one-shot

    def run_to_end(self, params: GenerationParams,
                   seed: int) -> tuple[np.ndarray, RowExtras | None]:
        """Prepare, every step and decode of one row (actions route, benchmarks)."""
        state = self.prepare(["one"], [params], [seed])
        while not state.done_denoising:
            self.denoise_step(state)
        return self.decode(state, 0), self.extras(state, 0)


def _combine(cond: torch.Tensor | None, uncond: torch.Tensor | None,
             guidance: float) -> torch.Tensor | None:
    if cond is None or uncond is None:
        return cond
    return uncond + guidance * (cond - uncond)


def _as_int(value: Any) -> int | None:
    """A domain id as a plain int (the pipeline hands it over as a tensor)."""
    if value is None:
        return None
    return int(value.item()) if isinstance(value, torch.Tensor) else int(value)
