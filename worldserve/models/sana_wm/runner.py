"""SANA-WM realtime sessions: chunked image-to-video restarts of the bidirectional stage 1,
optionally polished by the chunk-causal stage-2 refiner streamed per session.

Per chunk (L = frames_per_block latent frames, the LTX-2 VAE's 8x temporal stride):
1. the action DSL for the chunk's 8L new frames comes from the chunk's camera keys, so a key
   change takes effect at the next chunk boundary;
2. `SanaWMPipeline.__call__` runs 1 + 8L frames from the session's current image (chunk 0: the
   init's `first_frame`; later: the previous chunk's last frame), with the session's cached
   prompt embeddings and its own generator; chunk 0 emits all 1 + 8L frames, later chunks drop
   their first (a copy of the frame they start from) and emit 8L;
3. with a refiner, the chunk's new stage-1 latents go through the session's `RefinerStream`
   (sink + history KV cache advanced block by block) and the refined latents are decoded.

Stage 1 is bidirectional (no causal cache exists for it), so its per-session state is one
image, four intrinsics and the prompt embeddings; the camera trajectory restarts from identity
each chunk. The refiner's KV is bounded by `kv_max_frames` (the session's window).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from worldserve.errors import InvalidRequest
from worldserve.models.camera_keys import action_string, check_camera
from worldserve.models.common import count_parameters, require_local_dir, resolve_dtype
from worldserve.models.frames import decode_first_frame, to_uint8
from worldserve.models.sana_wm.family import PIPELINE_NAME, REFINER_DIR
from worldserve.models.sana_wm.refiner_stream import RefinerStream
from worldserve.models.sana_wm.vae_stream import StreamingLTX2Decoder, can_stream
from worldserve.models.types import (
    ChunkRunOutput,
    RealtimeModelFacts,
    WorldSessionSettings,
    WorldSessionState,
)

REFINER = "SanaWMLTX2Refiner"


@dataclass(frozen=True)
class SanaWMRealtimeDefaults:
    """Session defaults. The public checkpoint is trained at 1280x704; its offline default is
    60 steps with guidance 5 (far from realtime: the stage's num_inference_steps lowers it)."""

    frames_per_block: int = 3  # latent frames per chunk: 24 new frames (chunk 0: 25)
    default_num_inference_steps: int = 8
    default_fps: int = 16
    default_width: int = 1280
    default_height: int = 704
    refiner_sink_frames: int = 1
    refiner_window_frames: int = 11  # kv_max_frames: 1 sink + 10 history
    refiner_block_frames: int = 3
    focal_fraction: float = 1.0  # default intrinsics: fx = fy = this x max(image side)
    max_sequence_length: int = 300


def load_runner(model_dir: Path, *, dtype: str = "float32", device: str = "cpu") -> SanaWMRunner:
    """The registry's realtime loader: `model_dir` is a SanaWMPipeline directory; a
    `refiner/` sub-directory holding a SanaWMLTX2Refiner enables stage 2."""
    from diffusers import SanaWMPipeline
    from diffusers.pipelines.sana_wm.refiner import SanaWMLTX2Refiner

    path = require_local_dir(model_dir)
    torch_dtype = resolve_dtype(dtype)
    pipe = SanaWMPipeline.from_pretrained(path, dtype=torch_dtype, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    refiner = None
    if (path / REFINER_DIR / "model_index.json").is_file():
        refiner = SanaWMLTX2Refiner.from_pretrained(path / REFINER_DIR, dtype=torch_dtype,
                                                    local_files_only=True)
        refiner.set_progress_bar_config(disable=True)
        refiner.to(device)
    return SanaWMRunner(pipe.to(device), refiner)


class SanaWMCache:
    """Size facts of a session's state: the refiner's sink + history KV, or just the image."""

    def __init__(self, session: SanaWMSession) -> None:
        self._session = session

    @property
    def num_frames(self) -> int:
        stream = self._session.refiner
        return stream.cached_frames if stream is not None else 0

    @property
    def num_tokens(self) -> int:
        stream = self._session.refiner
        return stream.cached_frames * stream.tokens_per_frame if stream is not None else 0

    def nbytes(self) -> int:
        s = self._session
        image = s.image.width * s.image.height * 3 if s.image is not None else 0
        decoder = s.decoder.nbytes() if s.decoder is not None else 0
        return image + decoder + (s.refiner.nbytes() if s.refiner is not None else 0)


class SanaWMSession:
    """One session's state; `release()` drops it all."""

    def __init__(self, session_id: str, settings: WorldSessionSettings, prompt: str,
                 image: Image.Image, intrinsics: list[float], cropped_intrinsics: list[float],
                 embeds: tuple[torch.Tensor, ...], refiner: RefinerStream | None) -> None:
        self.session_id = session_id
        # The encoded first_frame (up to the media limit) is not kept: `image` is the state.
        self.settings = dataclasses.replace(settings, first_frame=None)
        self.prompt = prompt
        self.image: Image.Image | None = image
        self.intrinsics = intrinsics  # chunk 0: in first_frame pixels; then at session size
        self.cropped_intrinsics = cropped_intrinsics
        self.embeds: tuple[torch.Tensor, ...] | None = embeds
        self.refiner = refiner
        # Refined latents are decoded by a streaming decoder when the VAE allows it, else with
        # the previous block's last latent as context (`last_refined`).
        self.decoder: StreamingLTX2Decoder | None = None
        self.last_refined: torch.Tensor | None = None
        # Noise is drawn on the CPU so a seed gives the same frames on every device.
        self.generator = torch.Generator(device="cpu").manual_seed(settings.seed)
        self.next_chunk = 0
        self.state = WorldSessionState.ACTIVE
        self.cache = SanaWMCache(self)

    def release(self) -> None:
        if self.state is WorldSessionState.RELEASED:
            return
        if self.refiner is not None:
            self.refiner.release()
        if self.decoder is not None:
            self.decoder.release()
        self.refiner = self.decoder = None
        self.image = self.embeds = self.last_refined = None
        self.state = WorldSessionState.RELEASED


class SanaWMRunner:
    """Stateless over sessions: each session's tensors live in its `SanaWMSession`."""

    def __init__(self, pipe: Any, refiner: Any | None = None,
                 defaults: SanaWMRealtimeDefaults = SanaWMRealtimeDefaults()) -> None:
        self.model = pipe
        self.refiner = refiner
        self.defaults = defaults
        self.upsampling = int(pipe.vae_temporal_compression_ratio)
        self.num_params = count_parameters(pipe) + (count_parameters(refiner) if refiner else 0)
        self.facts = self._facts()

    def _facts(self) -> RealtimeModelFacts:
        d = self.defaults
        kv_per_token = 0
        if self.refiner is not None:
            cfg = self.refiner.transformer.config
            dtype = next(self.refiner.transformer.parameters()).dtype
            inner = cfg.num_attention_heads * cfg.attention_head_dim
            kv_per_token = 2 * cfg.num_layers * inner * dtype.itemsize
        return RealtimeModelFacts(
            pipeline=PIPELINE_NAME if self.refiner is None else f"{PIPELINE_NAME}+{REFINER}",
            frames_per_block=d.frames_per_block, default_sink_frames=d.refiner_sink_frames,
            default_window_frames=d.refiner_window_frames,
            max_window_frames=d.refiner_window_frames,
            default_num_inference_steps=d.default_num_inference_steps, default_fps=d.default_fps,
            default_width=d.default_width, default_height=d.default_height,
            size_multiple=int(self.model.vae_spatial_compression_ratio),
            min_pulse_items=1, kv_bytes_per_token=kv_per_token, first_frame="required",
            guidance=True)

    # ------------------------------------------------------------------ sessions

    def new_session(self, session_id: str, settings: WorldSessionSettings,
                    prompt: str) -> SanaWMSession:
        if settings.first_frame is None:
            raise InvalidRequest(f"{PIPELINE_NAME} sessions start from an image: first_frame "
                                 "is required in the init")
        block = self.defaults.refiner_block_frames
        if self.refiner is not None and settings.frames_per_block % block:
            raise InvalidRequest(f"frames_per_block {settings.frames_per_block} must be a "
                                 f"multiple of the refiner's block ({block})")
        image = decode_first_frame(settings.first_frame)
        focal = self.defaults.focal_fraction * max(image.size)
        intrinsics = (list(settings.intrinsics) if settings.intrinsics
                      else [focal, focal, image.width / 2, image.height / 2])
        _, cropped = self.model.image_processor.preprocess_with_intrinsics(
            image, np.asarray([intrinsics], np.float32), settings.height, settings.width)
        stream = None
        if self.refiner is not None:
            stream = RefinerStream(self.refiner, prompt, fps=self.defaults.default_fps,
                                   seed=settings.seed, sink_size=settings.sink_frames,
                                   block_size=self.defaults.refiner_block_frames,
                                   kv_max_frames=settings.window_frames)
        session = SanaWMSession(session_id, settings, prompt, image, intrinsics,
                                [float(v) for v in cropped[0]],
                                self.encode_prompt(prompt, settings.negative_prompt), stream)
        if stream is not None and can_stream(self.model.vae):
            session.decoder = StreamingLTX2Decoder(self.model.vae)
        return session

    def encode_prompt(self, prompt: str, negative_prompt: str = "") -> tuple[torch.Tensor, ...]:
        from diffusers.pipelines.sana_wm.pipeline_sana_wm import DEFAULT_CHI_PROMPT

        with torch.inference_mode():
            return tuple(self.model.encode_prompt(
                prompt, negative_prompt, max_sequence_length=self.defaults.max_sequence_length,
                chi_prompt=DEFAULT_CHI_PROMPT))

    def chunk_frames(self, chunk_index: int, frames_per_block: int) -> int:
        """Chunk 0 emits its start image too (1 + 8L frames); later chunks 8L new frames."""
        return self.upsampling * frames_per_block + (1 if chunk_index == 0 else 0)

    # ------------------------------------------------------------------ one chunk

    @torch.inference_mode()
    def run_chunk(self, session: SanaWMSession, camera: list[list[str]] | None,
                  prompt: str | None = None, refresh_kv: bool = False) -> ChunkRunOutput:
        start = time.perf_counter()
        s = session.settings
        first = session.next_chunk == 0
        new_frames = self.upsampling * s.frames_per_block
        check_camera(camera, new_frames + 1)
        entries = (camera or [])[1:] if first else camera
        if prompt is not None and prompt != session.prompt:
            self._switch_prompt(session, prompt)
        out = self._stage1(session, action_string(entries, new_frames))
        frames = to_uint8(out.frames)
        session.image = Image.fromarray(frames[-1])
        session.intrinsics = session.cropped_intrinsics
        latents = out.latent if first else out.latent[:, :, 1:]
        emitted = frames if first else frames[1:]
        decode_start = time.perf_counter()
        if session.refiner is not None:
            latents = session.refiner.push(latents)
            emitted = self._decode_refined(session, latents, first)
        session.next_chunk += 1
        end = time.perf_counter()
        return ChunkRunOutput(np.ascontiguousarray(emitted).tobytes(), len(emitted),
                              (end - start) * 1000, None, latents,
                              dit_ms=(decode_start - start) * 1000,
                              decode_ms=(end - decode_start) * 1000)

    def _stage1(self, session: SanaWMSession, action: str) -> Any:
        s = session.settings
        cond, cond_mask, neg, neg_mask = session.embeds
        return self.model(
            image=session.image, prompt=session.prompt, action=action,
            intrinsics=session.intrinsics, height=s.height, width=s.width,
            num_frames=self.upsampling * s.frames_per_block + 1, fps=self.defaults.default_fps,
            num_inference_steps=s.num_inference_steps, guidance_scale=s.guidance_scale,
            generator=session.generator, prompt_embeds=cond, prompt_attention_mask=cond_mask,
            negative_prompt_embeds=neg, negative_prompt_attention_mask=neg_mask,
            output_type="np")

    def _decode_refined(self, session: SanaWMSession, refined: torch.Tensor,
                        first: bool) -> np.ndarray:
        """Streamed: the session's LTX-2 decoder continues where the last chunk stopped (equal
        to one decode of the whole refined video). Otherwise (a non-causal decoder): decode
        with the previous block's last latent as temporal context and drop that frame."""
        if session.decoder is not None:
            pixels = session.decoder(self._vae_space(refined))
            return to_uint8(self.model.video_processor.postprocess_video(pixels, "np")[0])
        context = refined if first else torch.cat([session.last_refined, refined], dim=2)
        session.last_refined = refined[:, :, -1:]
        pixels = self.model._decode_latents(context)
        frames = to_uint8(self.model.video_processor.postprocess_video(pixels, output_type="np")[0])
        return frames if first else frames[1:]

    def _vae_space(self, latents: torch.Tensor) -> torch.Tensor:
        """Model-space latents -> the VAE's (the inverse of the pipeline's normalisation)."""
        vae = self.model.vae
        latents = latents.to(vae.dtype)
        mean = vae.latents_mean.view(1, -1, 1, 1, 1).to(latents)
        std = vae.latents_std.view(1, -1, 1, 1, 1).to(latents)
        return latents / vae.config.scaling_factor * std + mean

    def _switch_prompt(self, session: SanaWMSession, prompt: str) -> None:
        """A new prompt: new stage-1 embeddings and refiner embeddings; the refiner's history
        K/V (computed under the old prompt) is kept, like the causal model without refresh."""
        session.prompt = prompt
        session.embeds = self.encode_prompt(prompt, session.settings.negative_prompt)
        if session.refiner is not None:
            stream = session.refiner
            stream.prompt_embeds, stream.prompt_mask = self.refiner._encode_prompt(
                prompt, device=stream.device, dtype=stream.dtype)
