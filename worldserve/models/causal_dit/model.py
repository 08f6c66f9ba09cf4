"""A plain-PyTorch causal (frame-autoregressive) DiT in the Wan / Self-Forcing style.

The model is stateless: callers pass the cached self-attention K/V of earlier frames
(`past_kv`) and get the current tokens' K/V back (`return_kv`). Keys are rotated (3-D RoPE with
the *absolute* latent-frame index as time coordinate) before they are returned, so a cache can
drop old frames without re-rotating the rest. `block_causal_mask` builds the equivalent
training-time mask, used by the tests to check cached == recomputed.

Shapes: latents (B, C, T, h, w); tokens (B, N, D) with N = T * tokens_per_frame, frame-major.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

CAMERA_KEYS = ("w", "a", "s", "d", "i", "j", "k", "l")
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"

KV = tuple[torch.Tensor, torch.Tensor]  # (B, H, N, Dh) each


@dataclass(frozen=True)
class CausalDiTConfig:
    """Sizes of the causal DiT. Real Wan-2.1-1.3B causal models: dim 1536, 30 layers, 12 heads."""

    in_channels: int = 16  # Wan VAE latent channels
    patch_size: int = 2  # spatial patch; one latent frame per token in time
    dim: int = 64
    num_heads: int = 2
    num_layers: int = 2
    ffn_dim: int = 128
    text_dim: int = 32  # width of the text encoder's hidden states
    freq_dim: int = 64  # sinusoidal timestep features
    num_camera_keys: int = len(CAMERA_KEYS)
    # Temporal RoPE range in latent frames: sessions re-base positions before exceeding it.
    max_rope_frames: int = 1024
    rope_theta: float = 10000.0
    eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    def save(self, directory: Path) -> None:
        data = {"_class_name": "WorldserveCausalDiT", **asdict(self)}
        (directory / CONFIG_NAME).write_text(json.dumps(data, indent=2) + "\n")

    @classmethod
    def load(cls, directory: Path) -> "CausalDiTConfig":
        data = json.loads((directory / CONFIG_NAME).read_text())
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def timestep_features(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal features of timesteps in [0, 1000]: (..., ) -> (..., dim)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
    args = t.float()[..., None] * freqs.to(t.device)
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def rope_split(head_dim: int) -> tuple[int, int, int]:
    """Head-dim split over the (t, y, x) axes, Wan's rule (each part even)."""
    hw = 2 * (head_dim // 6)
    return head_dim - 2 * hw, hw, hw


def rope_angles(cfg: CausalDiTConfig, frame_pos: torch.Tensor, hp: int, wp: int) -> torch.Tensor:
    """Rotation angles for the tokens of frames at `frame_pos` (T,) -> (T * hp * wp, head_dim/2)."""
    parts = []
    grids = torch.meshgrid(frame_pos.float(), torch.arange(hp).float(), torch.arange(wp).float(),
                           indexing="ij")
    for size, grid in zip(rope_split(cfg.head_dim), grids):
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, size, 2, dtype=torch.float32) / size))
        parts.append(grid.reshape(-1, 1) * inv.to(grid.device))
    return torch.cat(parts, dim=-1)


def apply_rope(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs of x (B, H, N, Dh) by angles (N, Dh/2)."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    out = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return out.flatten(-2)


class Block(nn.Module):
    """AdaLN-modulated self-attention (cached) + cross-attention to text + MLP."""

    def __init__(self, cfg: CausalDiTConfig) -> None:
        super().__init__()
        d, self.cfg = cfg.dim, cfg
        self.modulation = nn.Linear(d, 6 * d)
        self.norm1 = nn.LayerNorm(d, elementwise_affine=False, eps=cfg.eps)
        self.qkv = nn.Linear(d, 3 * d)
        self.q_norm = nn.RMSNorm(cfg.head_dim, eps=cfg.eps)
        self.k_norm = nn.RMSNorm(cfg.head_dim, eps=cfg.eps)
        self.attn_out = nn.Linear(d, d)
        self.norm_cross = nn.LayerNorm(d, eps=cfg.eps)
        self.cross_q = nn.Linear(d, d)
        self.cross_kv = nn.Linear(cfg.text_dim, 2 * d)
        self.cross_out = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d, elementwise_affine=False, eps=cfg.eps)
        self.mlp = nn.Sequential(nn.Linear(d, cfg.ffn_dim), nn.GELU(approximate="tanh"),
                                 nn.Linear(cfg.ffn_dim, d))

    def _heads(self, x: torch.Tensor) -> torch.Tensor:  # (B, N, D) -> (B, H, N, Dh)
        b, n, _ = x.shape
        return x.view(b, n, self.cfg.num_heads, self.cfg.head_dim).transpose(1, 2)

    def text_kv(self, text: torch.Tensor) -> KV:
        """Cross-attention K/V of a prompt (B, L, text_dim): the per-prompt cache."""
        k, v = self.cross_kv(text).chunk(2, dim=-1)
        return self._heads(k), self._heads(v)

    def forward(self, x: torch.Tensor, cond: torch.Tensor, angles: torch.Tensor, text_kv: KV,
                past_kv: KV | None, mask: torch.Tensor | None) -> tuple[torch.Tensor, KV]:
        # x (B, N, D); cond (B, N, D) per-token conditioning (frame timestep + camera)
        shift1, scale1, gate1, shift2, scale2, gate2 = self.modulation(F.silu(cond)).chunk(6, -1)
        h = self.norm1(x) * (1 + scale1) + shift1
        q, k, v = (self._heads(t) for t in self.qkv(h).chunk(3, dim=-1))
        q = apply_rope(self.q_norm(q), angles)
        k = apply_rope(self.k_norm(k), angles)
        k_all, v_all = k, v
        if past_kv is not None and past_kv[0].shape[2] > 0:
            k_all = torch.cat([past_kv[0], k], dim=2)
            v_all = torch.cat([past_kv[1], v], dim=2)
        a = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask)
        x = x + gate1 * self.attn_out(a.transpose(1, 2).flatten(2))
        cq = self._heads(self.cross_q(self.norm_cross(x)))
        c = F.scaled_dot_product_attention(cq, text_kv[0], text_kv[1])
        x = x + self.cross_out(c.transpose(1, 2).flatten(2))
        x = x + gate2 * self.mlp(self.norm2(x) * (1 + scale2) + shift2)
        return x, (k, v)


class CausalDiT(nn.Module):
    """Frame-autoregressive DiT with per-frame timestep and camera conditioning."""

    def __init__(self, cfg: CausalDiTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, p = cfg.dim, cfg.patch_size
        self.patch_in = nn.Linear(cfg.in_channels * p * p, d)
        self.time_mlp = nn.Sequential(nn.Linear(cfg.freq_dim, d), nn.SiLU(), nn.Linear(d, d))
        # Held keys of a latent frame (fraction of its output frames holding each key) -> (D,)
        self.camera_embed = nn.Linear(cfg.num_camera_keys, d)
        self.text_norm = nn.LayerNorm(cfg.text_dim, eps=cfg.eps)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.out_modulation = nn.Linear(d, 2 * d)
        self.norm_out = nn.LayerNorm(d, elementwise_affine=False, eps=cfg.eps)
        self.patch_out = nn.Linear(d, cfg.in_channels * p * p)

    def tokens_per_frame(self, h: int, w: int) -> int:
        return (h // self.cfg.patch_size) * (w // self.cfg.patch_size)

    def text_kv(self, text: torch.Tensor) -> list[KV]:
        """Per-layer cross-attention K/V of text hidden states (B, L, text_dim)."""
        text = self.text_norm(text)
        return [block.text_kv(text) for block in self.blocks]

    def _patchify(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, T, h, w) -> (B, N, C*p*p)
        b, c, t, h, w = x.shape
        p = self.cfg.patch_size
        x = x.view(b, c, t, h // p, p, w // p, p).permute(0, 2, 3, 5, 1, 4, 6)
        return x.reshape(b, t * (h // p) * (w // p), c * p * p)

    def _unpatchify(self, x: torch.Tensor, t: int, h: int, w: int) -> torch.Tensor:
        b, p, c = x.shape[0], self.cfg.patch_size, self.cfg.in_channels
        x = x.view(b, t, h // p, w // p, c, p, p).permute(0, 4, 1, 2, 5, 3, 6)
        return x.reshape(b, c, t, h, w)

    def forward(self, x: torch.Tensor, timesteps: torch.Tensor, camera: torch.Tensor,
                frame_pos: torch.Tensor, text_kv: list[KV], past_kv: list[KV] | None = None,
                mask: torch.Tensor | None = None) -> tuple[torch.Tensor, list[KV]]:
        """Predict the flow velocity of `x` (B, C, T, h, w).

        timesteps (B, T) in [0, 1000]; camera (B, T, num_camera_keys); frame_pos (T,) absolute
        latent-frame positions; past_kv per layer or None; mask (N, N_past + N) or None.
        Returns (velocity like x, per-layer K/V of x's tokens, K after RoPE).
        """
        b, _, t, h, w = x.shape
        tpf = self.tokens_per_frame(h, w)
        tokens = self.patch_in(self._patchify(x))  # (B, N, D)
        cond = self.time_mlp(timestep_features(timesteps, self.cfg.freq_dim))
        cond = cond + self.camera_embed(camera)  # (B, T, D)
        cond = cond.repeat_interleave(tpf, dim=1)  # (B, N, D)
        angles = rope_angles(self.cfg, frame_pos, h // self.cfg.patch_size,
                             w // self.cfg.patch_size).to(x.device)
        new_kv: list[KV] = []
        for i, block in enumerate(self.blocks):
            past = past_kv[i] if past_kv is not None else None
            tokens, kv = block(tokens, cond, angles, text_kv[i], past, mask)
            new_kv.append(kv)
        shift, scale = self.out_modulation(F.silu(cond)).chunk(2, dim=-1)
        out = self.patch_out(self.norm_out(tokens) * (1 + scale) + shift)
        return self._unpatchify(out, t, h, w), new_kv


def block_causal_mask(num_frames: int, frames_per_block: int, tokens_per_frame: int,
                      sink_frames: int | None = None,
                      window_frames: int | None = None) -> torch.Tensor:
    """Boolean (N, N) mask: True where a query token may attend a key token.

    A frame sees every frame of its own block and, of earlier blocks, what a sink + sliding
    window cache would still hold when its block is generated: the first `sink_frames` frames
    and the most recent `window_frames - frames_per_block - sink` frames. None = unbounded.
    """
    frame = torch.arange(num_frames)
    block = frame // frames_per_block
    qb, kb = block[:, None], block[None, :]
    visible = kb == qb
    earlier = kb < qb
    if window_frames is None:
        visible = visible | earlier
    else:
        sink = sink_frames or 0
        recent = window_frames - frames_per_block - sink
        block_start = qb * frames_per_block
        kept = (frame[None, :] < sink) | (frame[None, :] >= block_start - recent)
        visible = visible | (earlier & kept)
    return visible.repeat_interleave(tokens_per_frame, 0).repeat_interleave(tokens_per_frame, 1)
