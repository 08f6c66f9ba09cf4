"""Streaming (causal) Wan VAE decode: one decoder feature cache per session.

`AutoencoderKLWan.decode()` clears its causal-conv cache on every call and keeps it on the
shared VAE object, so a session keeps its own cache list and drives the decoder frame by frame
exactly like `_decode` does (diffusers 0.42.1 internals; pinned in pyproject, and
tests/unit/realtime/test_vae_stream.py checks streaming == one-shot).
"""

from __future__ import annotations

from typing import Any

import torch


def temporal_upsampling(vae: Any) -> int:
    """Output frames per latent frame after the first (Wan 2.1: 4)."""
    return 2 ** sum(bool(x) for x in vae.config.temperal_downsample)


def decoded_frames(vae: Any, first_chunk: bool, num_latent_frames: int) -> int:
    """Output frames of `num_latent_frames` latent frames: the session's first latent frame
    decodes to one frame, every later one to `temporal_upsampling` frames."""
    per = temporal_upsampling(vae)
    return (1 + per * (num_latent_frames - 1)) if first_chunk else per * num_latent_frames


class StreamingWanDecoder:
    """Per-session causal decode state: the decoder's feature cache and whether it has started."""

    def __init__(self, vae: Any) -> None:
        self.vae = vae
        self.feat_cache: list[Any] | None = [None] * vae._cached_conv_counts["decoder"]
        self.first = True
        latent_dim = vae.config.z_dim
        self._mean = torch.tensor(vae.config.latents_mean).view(1, latent_dim, 1, 1, 1)
        self._std = torch.tensor(vae.config.latents_std).view(1, latent_dim, 1, 1, 1)

    def denormalize(self, latents: torch.Tensor) -> torch.Tensor:
        """Model-space latents -> VAE latents (Wan pipelines' `latents / (1/std) + mean`)."""
        mean = self._mean.to(latents.device, latents.dtype)
        std = self._std.to(latents.device, latents.dtype)
        return latents * std + mean

    @torch.inference_mode()
    def __call__(self, latents: torch.Tensor) -> torch.Tensor:
        """Decode new VAE-space latents (B, z, T, h, w) -> pixels (B, 3, T_out, H, W) in [-1, 1]."""
        if self.feat_cache is None:
            raise RuntimeError("the decoder state was released")
        x = self.vae.post_quant_conv(latents.to(self.vae.dtype))
        frames = []
        for i in range(x.shape[2]):
            frames.append(self.vae.decoder(x[:, :, i:i + 1], feat_cache=self.feat_cache,
                                           feat_idx=[0], first_chunk=self.first))
            self.first = False
        return torch.clamp(torch.cat(frames, dim=2), -1.0, 1.0)

    def release(self) -> None:
        self.feat_cache = None


def to_rgb24(pixels: torch.Tensor) -> tuple[bytes, int]:
    """(1, 3, T, H, W) in [-1, 1] -> (T frames of H x W x 3 uint8 concatenated, T)."""
    frames = ((pixels[0].float() + 1.0) * 127.5).round().clamp(0, 255).to(torch.uint8)
    frames = frames.permute(1, 2, 3, 0).contiguous()  # (T, H, W, 3)
    return frames.cpu().numpy().tobytes(), frames.shape[0]
