"""Cosmos3's denoise phase: one iteration of `Cosmos3OmniPipeline.__call__`'s loop per row (cond
and uncond forwards, CFG, one scheduler step per modality), each forward under the row's
step-cache context (levers/step_cache.py) and, when configured, replaying the prompt's
understanding K/V (models/cosmos3/kv_reuse.py)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from worldserve.levers.speed import CompileTimer
from worldserve.levers.step_cache import StepCacheOps
from worldserve.models.cosmos3.state import Cosmos3Batch, RowState


class Cosmos3Denoise(StepCacheOps):
    """The runner's `denoise_step` (a part of `Cosmos3Runner`, models/cosmos3/runner.py); each
    forward runs under the step-cache lever."""

    pipe: Any
    kv_reuse: Any
    compile_timer: CompileTimer

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
                self.release_step_cache(row)

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
        cond, uncond = self._guided_velocities(row, tokens, i, sigma, guidance != 1.0)
        velocity = [_combine(c, u, guidance) for c, u in
                    zip(cond, uncond if uncond is not None else (None, None, None))]
        row.latents = row.scheduler.step(velocity[0].unsqueeze(0), t, row.latents.unsqueeze(0),
                                         return_dict=False)[0].squeeze(0)
        if row.sound_scheduler is not None and velocity[1] is not None:
            row.sound_latents = row.sound_scheduler.step(
                velocity[1].unsqueeze(0), t, row.sound_latents.unsqueeze(0),
                return_dict=False)[0].squeeze(0)
        if row.action_scheduler is not None and row.noisy_action and velocity[2] is not None:
            row.action_latents = row.action_scheduler.step(
                velocity[2].unsqueeze(0), t, row.action_latents.unsqueeze(0),
                return_dict=False)[0].squeeze(0)
            if row.raw_action_dim is not None:
                row.action_latents[:, row.raw_action_dim:] = 0

    def _guided_velocities(self, row: RowState, tokens: dict[str, Any], i: int, sigma: float,
                           cfg: bool) -> tuple[list[Any], list[Any] | None]:
        """The cond forward's velocities and, with CFG, the uncond one's (a rank group splits
        them: models/cosmos3/parallel.py)."""
        cond = self._velocities(row, row.cond, tokens, i, sigma, "cond")
        uncond = self._velocities(row, row.uncond, tokens, i, sigma, "uncond") if cfg else None
        return cond, uncond

    def _velocities(self, row: RowState, packed: dict[str, Any], tokens: dict[str, Any],
                    i: int, sigma: float, name: str) -> list[Any]:
        """One forward (cond or uncond) and its masked velocities, as float32."""
        pipe = self.pipe
        device = row.device
        timestep = row.host_timesteps[i]
        vision_t = torch.full((packed["num_noisy_vision_tokens"],), timestep, device=device)
        sound_t = (torch.full((packed["sound_len"],), timestep, device=device)
                   if tokens["sound"] is not None else None)
        action_t = (torch.full((packed["num_noisy_action_tokens"],), timestep, device=device)
                    if tokens["action"] is not None else None)
        with self.cache_forward(row, name, i, sigma, len(row.timesteps)), \
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
        if self.kv_reuse is None or row.mixed_precision.enabled or row.cache.cached:
            return contextlib.nullcontext()
        from worldserve.models.cosmos3.kv_reuse import UnderstandingKV

        slot = row.understanding_kv.setdefault(name, UnderstandingKV())
        return self.kv_reuse.use(slot, und_len)

    def _reset_precision(self, row: RowState) -> None:
        from diffusers.pipelines.cosmos.mixed_precision import reset_cosmos3_mixed_precision

        reset_cosmos3_mixed_precision(self.pipe.transformer, row.mixed_precision)

def _combine(cond: torch.Tensor | None, uncond: torch.Tensor | None,
             guidance: float) -> torch.Tensor | None:
    if cond is None or uncond is None:
        return cond
    return uncond + guidance * (cond - uncond)
