"""Streaming (causal) LTX-2 VAE decode: one session's temporal conv caches across calls.

`AutoencoderKLLTX2Video.decode()` treats the start of every call as the start of the video: each
causal temporal conv pads with copies of the call's first frame and each temporal upsampler
drops its first `stride - 1` frames. A session decoding chunk by chunk instead keeps, per conv,
the last `kernel - 1` input frames of its previous call and drops frames only on its first call;
then the concatenated chunks equal one decode of the whole latent (tests check it). Only for a
VAE whose decoder is causal (`decoder_causal`), without noise injection or temporal tiling
(diffusers 0.42.1 internals; pinned in pyproject).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


def can_stream(vae: Any) -> bool:
    cfg = vae.config
    inject = cfg.decoder_inject_noise
    noisy = any(inject) if isinstance(inject, (list, tuple)) else bool(inject)
    return bool(cfg.decoder_causal) and not noisy and not getattr(vae, "use_framewise_decoding",
                                                                   False)


class StreamingLTX2Decoder:
    """Per-session decode state over a shared LTX-2 VAE (latents in VAE space)."""

    def __init__(self, vae: Any) -> None:
        from diffusers.models.autoencoders.autoencoder_kl_ltx2 import (
            LTX2VideoCausalConv3d,
            LTX2VideoUpsampler3d,
        )

        if not can_stream(vae):
            raise ValueError("the LTX-2 decoder is not causal (or injects noise): it cannot "
                             "be decoded chunk by chunk")
        self.vae = vae
        self.convs = [m for m in vae.decoder.modules() if isinstance(m, LTX2VideoCausalConv3d)]
        self.upsamplers = [m for m in vae.decoder.modules()
                           if isinstance(m, LTX2VideoUpsampler3d)]
        self.cache: dict[int, torch.Tensor] = {}
        self.first = True

    @torch.inference_mode()
    def __call__(self, latents: torch.Tensor) -> torch.Tensor:
        """VAE-space latents (B, C, T, h, w) -> pixels (B, 3, frames, H, W) in [-1, 1]."""
        with self._streaming():
            pixels = self.vae.decode(latents.to(self.vae.dtype), return_dict=False)[0]
        self.first = False
        return pixels

    def nbytes(self) -> int:
        """Bounded: `kernel - 1` feature frames per temporal conv."""
        return sum(t.numel() * t.element_size() for t in self.cache.values())

    def release(self) -> None:
        self.cache.clear()

    @contextlib.contextmanager
    def _streaming(self) -> Iterator[None]:
        """Swap the shared modules' forwards for this session's cached ones for one call."""
        patched = [(m, self._conv_forward(i, m)) for i, m in enumerate(self.convs)]
        if not self.first:
            patched += [(m, _upsampler_forward(m)) for m in self.upsamplers]
        try:
            for module, forward in patched:
                module.forward = forward
            yield
        finally:
            for module, _ in patched:
                del module.forward  # back to the class's forward

    def _conv_forward(self, index: int, conv: Any) -> Any:
        def forward(hidden_states: torch.Tensor, causal: bool = True) -> torch.Tensor:
            keep = conv.kernel_size[0] - 1
            if keep == 0:
                return conv.conv(hidden_states)
            past = self.cache.get(index)
            if past is None:  # the session's first frames: pad like decode() does
                past = hidden_states[:, :, :1].repeat((1, 1, keep, 1, 1))
            padded = torch.cat([past, hidden_states], dim=2)
            self.cache[index] = padded[:, :, -keep:]
            return conv.conv(padded)

        return forward


def _upsampler_forward(up: Any) -> Any:
    """LTX2VideoUpsampler3d.forward without the start-of-video frame drop."""

    def forward(hidden_states: torch.Tensor, causal: bool = True) -> torch.Tensor:
        b, _, t, h, w = hidden_states.shape
        s = up.stride
        residual = None
        if up.residual:
            residual = hidden_states.reshape(b, -1, s[0], s[1], s[2], t, h, w)
            residual = residual.permute(0, 1, 5, 2, 6, 3, 7, 4).flatten(6, 7).flatten(4, 5)
            residual = residual.flatten(2, 3).repeat(1, (s[0] * s[1] * s[2]) // up.upscale_factor,
                                                     1, 1, 1)
        out = up.conv(hidden_states, causal=causal).reshape(b, -1, s[0], s[1], s[2], t, h, w)
        out = out.permute(0, 1, 5, 2, 6, 3, 7, 4).flatten(6, 7).flatten(4, 5).flatten(2, 3)
        return out if residual is None else out + residual

    return forward
