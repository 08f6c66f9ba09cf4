"""A session's self-attention cache: per-layer K/V of retained latent frames, sink + window.

The window (in latent frames) is the capacity, sink included; the first `sink_frames` frames of
the session are pinned. Before a new block is generated, `make_room()` drops the oldest
non-sink frames so the block fits; the block's K/V are appended by `append()` after its clean
("context") pass. The clean latents and camera vectors of the retained frames are kept beside
the K/V so the cache can be rebuilt (prompt refresh, position re-base; spec section 6.4-6.5).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worldserve.models.causal_dit.model import KV


@dataclass(frozen=True)
class FrameRecord:
    """One retained latent frame: session frame number, RoPE position, generating block."""

    index: int
    position: int
    block_id: int


class SelfAttnCache:
    """K/V (after RoPE) and clean latents of at most `window_frames` latent frames."""

    def __init__(self, tokens_per_frame: int, sink_frames: int, window_frames: int) -> None:
        self.tokens_per_frame = tokens_per_frame
        self.sink_frames = sink_frames
        self.window_frames = window_frames
        self.kv: list[KV] | None = None  # per layer, (B, H, num_frames * tpf, Dh)
        # (B, C, num_frames, h, w), clean; C includes an image condition when the DiT takes one
        self.latents: torch.Tensor | None = None
        # (B, num_frames, ...): key-hold fractions, or a camera branch's ray tokens per frame
        self.camera: torch.Tensor | None = None
        self.frames: list[FrameRecord] = []

    @property
    def num_frames(self) -> int:
        return len(self.frames)

    @property
    def num_tokens(self) -> int:
        return 0 if self.kv is None else self.kv[0][0].shape[2]

    def nbytes(self) -> int:
        if self.kv is None:
            return 0
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.kv)

    def past(self) -> list[KV] | None:
        return self.kv

    def make_room(self, num_new_frames: int) -> int:
        """Evict the oldest non-sink frames so `num_new_frames` more fit. Returns frames dropped."""
        excess = self.num_frames + num_new_frames - self.window_frames
        if excess <= 0:
            return 0
        keep = []
        for i, frame in enumerate(self.frames):
            if frame.index < self.sink_frames or excess == 0:
                keep.append(i)
            else:
                excess -= 1
        dropped = self.num_frames - len(keep)
        self._select(keep)
        return dropped

    def _select(self, keep: list[int]) -> None:
        frames_idx = torch.tensor(keep, dtype=torch.long)
        tpf = self.tokens_per_frame
        token_idx = (frames_idx[:, None] * tpf + torch.arange(tpf)[None, :]).reshape(-1)
        if self.kv is not None:
            device = self.kv[0][0].device
            token_idx = token_idx.to(device)
            self.kv = [(k.index_select(2, token_idx), v.index_select(2, token_idx))
                       for k, v in self.kv]
        if self.latents is not None:
            self.latents = self.latents.index_select(2, frames_idx.to(self.latents.device))
            self.camera = self.camera.index_select(1, frames_idx.to(self.camera.device))
        self.frames = [self.frames[i] for i in keep]

    def append_kv(self, new_kv: list[KV]) -> None:
        if self.kv is None:
            self.kv = [(k.clone(), v.clone()) for k, v in new_kv]
        else:
            self.kv = [(torch.cat([k, nk], 2), torch.cat([v, nv], 2))
                       for (k, v), (nk, nv) in zip(self.kv, new_kv)]

    def append(self, new_kv: list[KV], latents: torch.Tensor, camera: torch.Tensor,
               frames: list[FrameRecord]) -> None:
        """Add a committed block: its K/V, clean latents (B, C, T, h, w) and camera (B, T, K)."""
        if self.num_frames + len(frames) > self.window_frames:
            raise RuntimeError("cache overflow: make_room() must run before append()")
        self.append_kv(new_kv)
        if self.latents is None:
            self.latents, self.camera = latents.clone(), camera.clone()
        else:
            self.latents = torch.cat([self.latents, latents], 2)
            self.camera = torch.cat([self.camera, camera], 1)
        self.frames.extend(frames)

    def clear_kv(self) -> None:
        """Drop the K/V only (retained latents stay): the first half of a rebuild."""
        self.kv = None

    def clear(self) -> None:
        self.kv = self.latents = self.camera = None
        self.frames = []
