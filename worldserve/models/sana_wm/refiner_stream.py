"""SANA-WM stage 2 streamed: the `SanaWMLTX2Refiner` loop, one block at a time across calls.

`SanaWMLTX2Refiner.__call__` refines a whole stage-1 latent block by block over a sliding
[sink + history + active block] K/V window. `RefinerStream` keeps that loop's state between
calls (the per-layer `SanaWMRefinerKVCache`, the history length, the frame frontier, the noise
generator and the prompt embeddings), so feeding a session's stage-1 latents chunk by chunk
gives what one `__call__` over their concatenation gives (tests check equality).

Bounded: the sink is `sink_size` frames of pre-RoPE K/V, the history at most
`kv_max_frames - sink_size` frames of post-RoPE K/V, per layer; pending stage-1 frames are
fewer than one block.
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers.models.transformers.transformer_sana_wm_refiner import SanaWMRefinerKVCache
from diffusers.pipelines.sana_wm.refiner import (
    STAGE_2_DISTILLED_SIGMA_VALUES,
    SanaWMLTX2Refiner,
    _pack_latents,
    _unpack_latents,
)
from diffusers.utils.torch_utils import randn_tensor


class RefinerStream:
    """One session's stage-2 state. `push(latents)` appends stage-1 latent frames and returns
    the refined frames of every block they complete (the first push also returns the sink
    frames, which the refiner passes through unrefined)."""

    def __init__(self, refiner: SanaWMLTX2Refiner, prompt: str, *, fps: float, seed: int,
                 sink_size: int = 1, block_size: int = 3, kv_max_frames: int = 11,
                 sigmas: tuple[float, ...] = STAGE_2_DISTILLED_SIGMA_VALUES) -> None:
        self.refiner = refiner
        self.device = refiner._execution_device
        self.dtype = next(refiner.transformer.parameters()).dtype
        self.fps = float(fps)
        self.sink_size, self.block_size = int(sink_size), int(block_size)
        self.max_history_frames = int(kv_max_frames) - self.sink_size
        self.sigmas = list(sigmas)
        # Same default stream as `__call__(generator=Generator(device).manual_seed(seed))`.
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.prompt_embeds, self.prompt_mask = refiner._encode_prompt(
            prompt, device=self.device, dtype=self.dtype)
        self.kv_cache = SanaWMRefinerKVCache(len(refiner.transformer.transformer_blocks))
        self.history_frames = 0
        self.next_frame = 0  # absolute latent index of the next frame to refine
        self.pending: torch.Tensor | None = None  # stage-1 frames not yet a full block
        self.tokens_per_frame = 0

    # ------------------------------------------------------------------ sizes

    @property
    def cached_frames(self) -> int:
        return (self.sink_size if self.next_frame else 0) + self.history_frames

    def nbytes(self) -> int:
        return sum(_layer_nbytes(layer) for layer in self.kv_cache.layer_caches)

    # ------------------------------------------------------------------ stream

    @torch.no_grad()
    def push(self, latents: torch.Tensor) -> torch.Tensor:
        """Append stage-1 latents (1, C, F, h, w); returns the refined (1, C, F', h, w)."""
        z = latents.to(self.device, self.dtype)
        self.pending = z if self.pending is None else torch.cat([self.pending, z], dim=2)
        out = []
        if self.next_frame == 0:
            if self.pending.shape[2] <= self.sink_size:
                return self.pending[:, :, :0]
            out.append(self._start(self.pending[:, :, :self.sink_size]))
            self.pending = self.pending[:, :, self.sink_size:]
        while self.pending.shape[2] >= self.block_size:
            out.append(self._refine_block(self.pending[:, :, :self.block_size]))
            self.pending = self.pending[:, :, self.block_size:]
        return torch.cat(out, dim=2) if out else z[:, :, :0]

    def flush(self) -> torch.Tensor:
        """Refine a last partial block (the end of a finite video, as `__call__` does)."""
        if self.pending is None or self.pending.shape[2] == 0 or self.next_frame == 0:
            return torch.empty(0)
        block, self.pending = self.pending, self.pending[:, :, :0]
        return self._refine_block(block)

    def release(self) -> None:
        self.kv_cache.clear()
        self.pending = None
        self.prompt_embeds = self.prompt_mask = None

    # ------------------------------------------------------------------ internals

    def _start(self, sink: torch.Tensor) -> torch.Tensor:
        """Capture the pre-RoPE sink K/V from the raw stage-1 sink frames (never refined)."""
        cfg = self.refiner.transformer.config
        side = cfg.patch_size
        self.tokens_per_frame = ((sink.shape[3] // side) * (sink.shape[4] // side)
                                 // cfg.patch_size_t)
        self._capture(sink.contiguous(), list(range(self.sink_size)), "capture_pre_rope")
        for layer in range(len(self.refiner.transformer.transformer_blocks)):
            cache = self.kv_cache.get(layer)
            cache.store_sink(*cache.get_captured_pre_rope())
        self.next_frame = self.sink_size
        return sink

    def _refine_block(self, clean_block: torch.Tensor) -> torch.Tensor:
        start, end = self.next_frame, self.next_frame + clean_block.shape[2]
        positions = list(range(start, end))
        self._slide_sink(start, clean_block)
        block = self._denoise(clean_block, positions)
        self._capture(block, positions, "inject_and_capture_post_rope")
        self._append_history(end - start)
        self.next_frame = end
        return block

    def _slide_sink(self, block_start: int, block: torch.Tensor) -> None:
        offset = block_start - self.history_frames - self.sink_size
        self.kv_cache.sink_pe = self.refiner.transformer.build_rotary_emb_for_absolute_positions(
            batch_size=block.shape[0], frame_positions=list(range(offset, offset + self.sink_size)),
            height=block.shape[3], width=block.shape[4], device=self.device, fps=self.fps)

    def _denoise(self, clean_block: torch.Tensor, positions: list[int]) -> torch.Tensor:
        """The refiner's 3-step Euler on one block (same arithmetic as `__call__`)."""
        refiner, cfg = self.refiner, self.refiner.transformer.config
        scheduler = refiner.scheduler
        scheduler.set_timesteps(sigmas=self.sigmas[:-1], device=self.device)
        sigmas = scheduler.sigmas.to(device=self.device, dtype=torch.float32)
        sigma_max = float(sigmas[0])
        noise = randn_tensor(clean_block.shape, generator=self.generator, device=self.device,
                             dtype=self.dtype)
        block = ((1.0 - sigma_max) * clean_block.float() + sigma_max * noise.float()).to(self.dtype)
        scheduler.set_timesteps(sigmas=[float(s) for s in sigmas[:-1]], device=self.device)
        batch, _, frames, height, width = clean_block.shape
        rope = refiner.transformer.build_rotary_emb_for_absolute_positions(
            batch_size=batch, frame_positions=positions, height=height, width=width,
            device=self.device, fps=self.fps)
        for i, t in enumerate(scheduler.timesteps):
            sigma = float(sigmas[i].item())
            tokens = _pack_latents(block, patch_size=cfg.patch_size, patch_size_t=cfg.patch_size_t)
            timestep = torch.full((batch, tokens.shape[1]),
                                  sigma * float(cfg.timestep_scale_multiplier),
                                  dtype=torch.float32, device=self.device)
            velocity = refiner.transformer(
                hidden_states=tokens, encoder_hidden_states=self.prompt_embeds, timestep=timestep,
                video_rotary_emb=rope, encoder_attention_mask=self.prompt_mask,
                kv_cache=self.kv_cache, kv_cache_mode="inject", return_dict=False)[0]
            raw_sigma = torch.full((batch, tokens.shape[1], 1), sigma, dtype=torch.float32,
                                   device=self.device)
            x0 = _unpack_latents((tokens.float() - velocity.float() * raw_sigma).to(self.dtype),
                                 num_frames=frames, height=height, width=width,
                                 patch_size=cfg.patch_size, patch_size_t=cfg.patch_size_t)
            if sigma <= 1.0e-6:
                block = x0.to(self.dtype)
            else:
                v = (block.float() - x0.float()) / sigma
                block = scheduler.step(v, t, block.float(), return_dict=False)[0].to(self.dtype)
        return block

    def _capture(self, clean: torch.Tensor, positions: list[int], mode: str) -> None:
        self.refiner._capture_block_kv(
            clean_block=clean, frame_positions=positions, prompt_embeds=self.prompt_embeds,
            prompt_attention_mask=self.prompt_mask, fps=self.fps, kv_cache=self.kv_cache,
            kv_cache_mode=mode, device=self.device)

    def _append_history(self, num_frames: int) -> None:
        """Append the captured post-RoPE K/V; trim the history to its bound."""
        keep = self.max_history_frames * self.tokens_per_frame
        self.history_frames += num_frames
        trim = self.max_history_frames > 0 and self.history_frames > self.max_history_frames
        for layer in range(len(self.refiner.transformer.transformer_blocks)):
            cache = self.kv_cache.get(layer)
            key, value = cache.get_captured_post_rope()
            history = cache.get_history()
            if history is not None:
                key, value = torch.cat([history[0], key], 1), torch.cat([history[1], value], 1)
            if trim:
                key, value = key[:, -keep:], value[:, -keep:]
            cache.store_history(key, value)
        if trim:
            self.history_frames = self.max_history_frames


def _layer_nbytes(cache: Any) -> int:
    tensors = (cache.sink_k_pre, cache.sink_v, cache.history_k, cache.history_v)
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)
