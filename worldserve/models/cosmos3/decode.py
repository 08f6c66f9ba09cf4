"""Cosmos3's decode phase: `Cosmos3OmniPipeline.__call__` step 8 for one row (the Wan VAE, whole
or a few latent frames per call: models/wan/vae.py), and the row's extras (the sound decoder,
the action slice)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from worldserve.models.cosmos3.state import Cosmos3Batch
from worldserve.models.types import RowExtras
from worldserve.models.wan.vae import WanDecodeJob


class Cosmos3Decode:
    """The runner's `decode`, `decode_chunk` and `extras` (a part of `Cosmos3Runner`,
    models/cosmos3/runner.py)."""

    pipe: Any
    sample_rate: int | None
    yield_point: Callable[[], None] | None

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

def _as_int(value: Any) -> int | None:
    """A domain id as a plain int (the pipeline hands it over as a tensor)."""
    if value is None:
        return None
    return int(value.item()) if isinstance(value, torch.Tensor) else int(value)
