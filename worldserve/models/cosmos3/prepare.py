"""Cosmos3's prepare phase: `Cosmos3OmniPipeline.__call__` steps 1-6 for each row (input checks,
prompt templates and tokens, initial noise and conditioning latents, the static sequence packs,
timesteps), the same calls in the same order; every row gets its own schedulers and its own
step-cache context (levers/step_cache.py)."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from worldserve.errors import InvalidRequest
from worldserve.ipc.messages import GenerationParams
from worldserve.levers.step_cache import StepCacheOps
from worldserve.models.cosmos3 import inputs
from worldserve.models.cosmos3.state import Cosmos3Batch, RowState

SAMPLING_DTYPE = torch.float32


class Cosmos3Prepare(StepCacheOps):
    """The runner's `prepare` (a part of `Cosmos3Runner`, models/cosmos3/runner.py); each row
    attaches to the step-cache lever."""

    pipe: Any

    @torch.no_grad()
    def prepare(self, row_owner: list[str], rows: list[GenerationParams],
                seeds: list[int]) -> Cosmos3Batch:
        states = [self._prepare_row(params, seed) for params, seed in zip(rows, seeds)]
        for state, params in zip(states, rows):
            self.attach_step_cache(state, bool(params.step_cache))
        release = self.release_step_cache if self.step_cache is not None else None
        return Cosmos3Batch(row_owner=row_owner, rows=states,
                            guidance_scale=rows[0].guidance_scale,
                            num_timesteps=len(states[0].timesteps), release=release)

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
            timesteps=timesteps, host_timesteps=timesteps.tolist(),
            noisy_action=(action_mask is not None
                          and bool(action_mask.sum() < action_mask.numel())),
            mixed_precision=self._mixed_precision(), device=device)

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
        # Step i is timestep i. Left unset, the scheduler finds its first index by looking the
        # first timestep up, and takes the second of two equal ones: from 201 steps on (the
        # tiny model's UniPC; the flow shift rounds the first timesteps to 999, 999) every row
        # then ran one index ahead and failed its last step (`assert self.this_order > 0`).
        scheduler.set_begin_index(0)
        return scheduler, scheduler.timesteps

    def _mixed_precision(self) -> Any:
        from diffusers.pipelines.cosmos.mixed_precision import Cosmos3MixedPrecisionConfig

        return Cosmos3MixedPrecisionConfig.resolve(self.pipe.transformer)
