"""Run one chunk of one session: few-step causal denoising over the session's cache, the clean
context pass that writes the block's K/V, and the streaming VAE decode.

Per chunk (spec realtime-video.md section 6.2): sample noise from the session's generator ->
N DMD steps that read the cache (predict x0, re-noise to the next sigma) -> one pass at t = 0
on the clean block that writes its K/V -> decode the block's frames.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import torch

from worldserve.models.camera_keys import check_camera
from worldserve.models.causal_dit.camera import camera_vectors, output_frames_per_latent
from worldserve.models.causal_dit.kv_cache import FrameRecord
from worldserve.models.causal_dit.lingbot import (
    chunk_camera_tokens,
    default_intrinsics,
    transform_intrinsics,
)
from worldserve.models.causal_dit.loader import RealtimeModel, load_realtime_model
from worldserve.models.causal_dit.state import CausalSession
from worldserve.models.causal_dit.vae_stream import (
    StreamingWanDecoder,
    temporal_upsampling,
    to_rgb24,
)
from worldserve.models.common import count_parameters, resolve_dtype
from worldserve.models.frames import decode_first_frame
from worldserve.models.types import ChunkRunOutput, RealtimeModelFacts, WorldSessionSettings


def dmd_sigmas(num_steps: int, shift: float) -> list[float]:
    """Few-step schedule: linspace(1, 0) without its end point, warped by `shift`."""
    base = torch.linspace(1.0, 0.0, num_steps + 1)[:-1]
    return (shift * base / (1 + (shift - 1) * base)).tolist()


def load_runner(model_dir: Path, *, dtype: str = "float32", device: str = "cpu") -> CausalRunner:
    """The registry's realtime loader for a causal DiT checkpoint directory."""
    return CausalRunner(load_realtime_model(model_dir, device, resolve_dtype(dtype)))


def model_facts(model: RealtimeModel) -> RealtimeModelFacts:
    """The engine's view of a causal checkpoint: text-to-video, no CFG (few-step distilled)."""
    mc, dit = model.config, model.dit.cfg
    return RealtimeModelFacts(
        pipeline=mc.pipeline, frames_per_block=mc.frames_per_block,
        default_sink_frames=mc.default_sink_frames,
        default_window_frames=mc.default_window_frames, max_window_frames=dit.max_rope_frames,
        default_num_inference_steps=mc.default_num_inference_steps, default_fps=mc.default_fps,
        default_width=mc.default_width, default_height=mc.default_height,
        size_multiple=model.spatial_factor, max_script_frames=mc.max_script_frames,
        min_pulse_items=mc.min_pulse_items,
        kv_bytes_per_token=2 * dit.num_layers * dit.dim * model.dtype.itemsize,
        camera_conditioning=getattr(dit, "num_camera_keys", 0) > 0,
        first_frame=first_frame_mode(model),
        guidance=not mc.guidance_distilled)


def first_frame_mode(model: RealtimeModel) -> str:
    if getattr(model.dit.cfg, "cond_channels", 0):
        return "required"  # the DiT's input has image-condition channels (LingBot-World)
    return "optional" if model.config.image_conditioning else "unsupported"


def session_intrinsics(settings: WorldSessionSettings, image: Any) -> tuple[float, ...]:
    """LingBot camera intrinsics at session size: the init's (in first_frame pixels) through
    the same resize + centre crop as the image, else upstream's example intrinsics rescaled."""
    w, h = settings.width, settings.height
    if settings.intrinsics is None or image is None:
        return default_intrinsics(w, h)
    resized = RealtimeModel.resized_size(image, w, h)
    return transform_intrinsics(tuple(settings.intrinsics), (image.width, image.height),
                                resized, (w, h))


def pin_first_frame(x: torch.Tensor, image: torch.Tensor | None) -> torch.Tensor:
    """`x` with its first latent frame replaced by the clean image latent (when given)."""
    if image is None:
        return x
    x = x.clone()
    x[:, :, :1] = image.to(x.dtype)
    return x


class CausalRunner:
    """Stateless over sessions: every tensor of a session lives in its `CausalSession`."""

    def __init__(self, model: RealtimeModel) -> None:
        self.model = model
        self.upsampling = temporal_upsampling(model.vae)
        self.num_params = sum(count_parameters(m)
                              for m in (model.dit, model.vae, model.text_encoder))
        self.facts = model_facts(model)

    # ------------------------------------------------------------------ sessions

    def new_session(self, session_id: str, settings: WorldSessionSettings,
                    prompt: str) -> CausalSession:
        f = self.model.spatial_factor
        tpf = (settings.height // f) * (settings.width // f)
        session = CausalSession(session_id, settings, prompt, self.model.encode_prompt(prompt),
                                StreamingWanDecoder(self.model.vae), tpf)
        if settings.guidance_scale != 1.0:
            session.uncond_kv = self.model.encode_prompt(settings.negative_prompt)
        image = None
        if settings.first_frame is not None:
            image = decode_first_frame(settings.first_frame)
            self._condition_on_image(session, image)
            # The encoded image is not kept (up to the media limit per session): the latent is.
            session.settings = dataclasses.replace(settings, first_frame=None)
        if getattr(self.model.dit, "camera_branch", None) is not None:
            session.intrinsics = session_intrinsics(settings, image)
        return session

    def _condition_on_image(self, session: CausalSession, image: Any) -> None:
        s, fb = session.settings, session.settings.frames_per_block
        if not getattr(self.model.dit.cfg, "cond_channels", 0):
            session.image_latent = self.model.encode_image(image, s.width, s.height)
            return
        cond = self.model.encode_condition(image, s.width, s.height, 2 * fb)
        # SGLang's LingBot adapter encodes one extra blank chunk and repeats it afterwards.
        session.condition = (cond[:, :, :fb].clone(), cond[:, :, fb:].clone())

    def _with_condition(self, session: CausalSession, x: torch.Tensor) -> torch.Tensor:
        """The DiT input: `x`, with the chunk's image condition appended when it takes one."""
        if session.condition is None:
            return x
        cond = session.condition[0 if session.next_frame == 0 else 1]
        return torch.cat([x, cond.to(x)], dim=1)

    def chunk_frames(self, chunk_index: int, frames_per_block: int) -> int:
        """Output frames of chunk `chunk_index` (the first is shorter: causal VAE)."""
        return sum(output_frames_per_latent(chunk_index == 0, frames_per_block, self.upsampling))

    # ------------------------------------------------------------------ one chunk

    @torch.inference_mode()
    def run_chunk(self, session: CausalSession, camera: list[list[str]] | None,
                  prompt: str | None = None, refresh_kv: bool = False) -> ChunkRunOutput:
        start = time.perf_counter()
        s = session.settings
        first = session.next_frame == 0
        cam = self._camera_input(session, camera, first)
        if prompt is not None and prompt != session.prompt:
            session.text_kv = self.model.encode_prompt(prompt)
            session.prompt = prompt
        # Evict first: a re-base then numbers only the frames that stay.
        session.cache.make_room(s.frames_per_block)
        refresh_ms = self._maybe_rebuild(session, refresh_kv)
        positions = torch.arange(session.next_position, session.next_position + s.frames_per_block)
        dit_start = time.perf_counter()
        x0 = self._denoise(session, cam, positions)
        self._commit(session, x0, cam, positions)
        decode_start = time.perf_counter()
        pixels = session.decoder(session.decoder.denormalize(x0))
        frames, num_frames = to_rgb24(pixels)
        end = time.perf_counter()
        return ChunkRunOutput(frames, num_frames, (end - start) * 1000, refresh_ms, x0,
                           dit_ms=(decode_start - dit_start) * 1000,
                           decode_ms=(end - decode_start) * 1000)

    def _camera_input(self, session: CausalSession, camera: list[list[str]] | None,
                      first: bool) -> torch.Tensor:
        """Key-hold fractions (1, F, K) for the project's DiT; for a LingBot camera branch the
        Plücker-ray tokens of the chunk's latent frames (the rollout's pitch advances)."""
        s, dit = session.settings, self.model.dit
        max_entries = self.upsampling * s.frames_per_block
        if getattr(dit, "camera_branch", None) is None:
            counts = output_frames_per_latent(first, s.frames_per_block, self.upsampling)
            cam = camera_vectors(camera, counts, max_entries)[None]  # (1, F, K)
        else:
            check_camera(camera, max_entries)
            cam, session.pitch_steps = chunk_camera_tokens(
                camera, first, s.frames_per_block, self.upsampling, session.pitch_steps,
                session.intrinsics, s.height, s.width, dit.ray_stride, dit.cfg.patch_size)
        return cam.to(self.model.device, self.model.dtype)

    def _denoise(self, session: CausalSession, cam: torch.Tensor,
                 positions: torch.Tensor) -> torch.Tensor:
        s, dit = session.settings, self.model.dit
        f = self.model.spatial_factor // dit.cfg.patch_size
        shape = (1, dit.cfg.in_channels, s.frames_per_block, s.height // f, s.width // f)
        dtype, device = self.model.dtype, self.model.device
        x = torch.randn(shape, generator=session.generator).to(device, dtype)
        sigmas = dmd_sigmas(s.num_inference_steps, self.model.config.timestep_shift)
        image = session.image_latent if session.next_frame == 0 else None
        x = pin_first_frame(x, image)
        x0 = x
        for i, sigma in enumerate(sigmas):
            t = torch.full((1, s.frames_per_block), sigma * 1000.0, device=device)
            if image is not None:
                t[:, 0] = 0.0  # the image frame is clean at every step
            v = self._velocity(session, x, t, cam, positions)
            # flow matching: x_t = (1 - s) x0 + s noise, v = noise - x0
            x0 = pin_first_frame(x - sigma * v, image)
            if i + 1 < len(sigmas):
                noise = torch.randn(shape, generator=session.generator).to(device, dtype)
                x = pin_first_frame((1 - sigmas[i + 1]) * x0 + sigmas[i + 1] * noise, image)
        return x0

    def _velocity(self, session: CausalSession, x: torch.Tensor, t: torch.Tensor,
                  cam: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The DiT's velocity; with guidance_scale != 1 also the negative prompt's, combined as
        v_u + g (v_c - v_u) (two forwards over the same self-attention cache)."""
        past = session.cache.past()
        x = self._with_condition(session, x)
        v, _ = self.model.dit(x, t, cam, positions, session.text_kv, past_kv=past)
        g = session.settings.guidance_scale
        if session.uncond_kv is None or g == 1.0:
            return v
        v_uncond, _ = self.model.dit(x, t, cam, positions, session.uncond_kv, past_kv=past)
        return v_uncond + g * (v - v_uncond)

    def _commit(self, session: CausalSession, x0: torch.Tensor, cam: torch.Tensor,
                positions: torch.Tensor) -> None:
        """Context pass at t = 0 on the clean block: write its K/V, advance the frontier."""
        s = session.settings
        t = torch.zeros((1, s.frames_per_block), device=self.model.device)
        x0 = self._with_condition(session, x0)  # retained with its condition (rebuilds)
        _, kv = self.model.dit(x0, t, cam, positions, session.text_kv, past_kv=session.cache.past())
        block_id = session.next_chunk
        records = [FrameRecord(session.next_frame + i, int(p), block_id)
                   for i, p in enumerate(positions.tolist())]
        session.cache.append(kv, x0, cam, records)
        session.next_frame += s.frames_per_block
        session.next_position += s.frames_per_block
        session.next_chunk += 1

    # ------------------------------------------------------------------ rebuilds

    def _maybe_rebuild(self, session: CausalSession, refresh_kv: bool) -> float | None:
        s = session.settings
        rebase = session.next_position + s.frames_per_block > self.model.dit.cfg.max_rope_frames
        if not (refresh_kv or rebase) or session.cache.num_frames == 0:
            return None
        start = time.perf_counter()
        self.rebuild(session, rebase=rebase)
        return (time.perf_counter() - start) * 1000

    def rebuild(self, session: CausalSession, rebase: bool = False) -> None:
        """Recompute the self-attention cache from the retained clean latents (spec 6.4/6.5):
        block by block in their original order, at their original positions or, with `rebase`,
        at positions 0..n-1, under the session's current prompt."""
        cache = session.cache
        latents, camera, frames = cache.latents, cache.camera, list(cache.frames)
        positions = [i if rebase else fr.position for i, fr in enumerate(frames)]
        cache.clear_kv()
        start = 0
        while start < len(frames):
            end = start
            while end < len(frames) and frames[end].block_id == frames[start].block_id:
                end += 1
            pos = torch.tensor(positions[start:end])
            t = torch.zeros((1, end - start), device=self.model.device)
            _, kv = self.model.dit(latents[:, :, start:end], t, camera[:, start:end], pos,
                                   session.text_kv, past_kv=cache.past())
            cache.append_kv(kv)
            start = end
        cache.frames = [FrameRecord(fr.index, p, fr.block_id) for fr, p in zip(frames, positions)]
        if rebase:
            session.next_position = len(frames)
