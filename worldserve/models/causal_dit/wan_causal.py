"""A block-causal, KV-cached forward over diffusers' `WanTransformer3DModel` weights: how a
Self-Forcing-style causal Wan checkpoint (mapped by `upstream.py`) runs chunk by chunk.

`CausalWanDiT` has `CausalDiT`'s call signature, so `CausalRunner`, `SelfAttnCache` and the
engine drive it unchanged: `forward(x, timesteps, camera, frame_pos, text_kv, past_kv, mask)`
returns the flow velocity of the block and its per-layer self-attention K/V (after RoPE,
(B, H, N, Dh)). Per-frame timesteps go through Wan's per-token timestep path (as Wan 2.2 TI2V
does); temporal RoPE is indexed by absolute latent-frame positions. Without a camera branch
the camera input is ignored (Self-Forcing checkpoints have none); with LingBot-World's
(`lingbot.CameraBranch`) it is the Plücker-ray tokens (B, T, tokens per frame, features) and
modulates every block after its self-attention residual. An image-conditioned checkpoint
(more input than output channels) takes `x` with its condition channels already appended.
Tests: a first block with no past equals the diffusers model's own forward; cached chunk by
chunk equals one masked forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from worldserve.models.camera_keys import CAMERA_KEYS
from worldserve.models.causal_dit.lingbot import CameraBranch, ray_stride

KV = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class CausalWanConfig:
    """What the runner and engine read from a DiT (`CausalDiTConfig`'s names)."""

    in_channels: int  # latent channels (what the DiT predicts and the runner samples)
    patch_size: int  # spatial patch (Wan: 2); one latent frame per token in time
    dim: int
    num_heads: int
    num_layers: int
    text_dim: int
    max_rope_frames: int
    cond_channels: int = 0  # image condition appended to the input (LingBot: 4 mask + 16)
    num_camera_keys: int = 0  # > 0: a camera branch consumes held keys (LingBot-World)


def rope_tables(wan: Any, frame_pos: torch.Tensor, pph: int,
                ppw: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Wan's (cos, sin) per token for frames at absolute `frame_pos` on a pph x ppw grid."""
    rope = wan.rope
    split = [rope.t_dim, rope.h_dim, rope.w_dim]
    out = []
    for table in (rope.freqs_cos, rope.freqs_sin):
        t_part, h_part, w_part = table.split(split, dim=1)
        ppf = len(frame_pos)
        f = t_part[frame_pos.long()].view(ppf, 1, 1, -1).expand(ppf, pph, ppw, -1)
        h = h_part[:pph].view(1, pph, 1, -1).expand(ppf, pph, ppw, -1)
        w = w_part[:ppw].view(1, 1, ppw, -1).expand(ppf, pph, ppw, -1)
        out.append(torch.cat([f, h, w], dim=-1).reshape(1, ppf * pph * ppw, 1, -1))
    return out[0], out[1]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """diffusers' Wan rotary embedding on (B, N, H, Dh)."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[..., 0::2], sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * c - x2 * s
    out[..., 1::2] = x1 * s + x2 * c
    return out.type_as(x)


class CausalWanDiT(nn.Module):
    """Wraps a loaded `WanTransformer3DModel` (text-to-video, no image branch)."""

    def __init__(self, wan: Any, camera_branch: CameraBranch | None = None) -> None:
        super().__init__()
        self.wan = wan.eval()
        c = wan.config
        if c.image_dim is not None:
            raise ValueError("image-to-video Wan DiTs with a CLIP image branch (image_dim set) "
                             "are not supported here")
        self.cfg = CausalWanConfig(
            in_channels=c.out_channels, patch_size=c.patch_size[1], dim=wan.inner_dim
            if hasattr(wan, "inner_dim") else c.num_attention_heads * c.attention_head_dim,
            num_heads=c.num_attention_heads, num_layers=c.num_layers, text_dim=c.text_dim,
            max_rope_frames=c.rope_max_seq_len, cond_channels=c.in_channels - c.out_channels,
            num_camera_keys=len(CAMERA_KEYS) if camera_branch is not None else 0)
        self.camera_branch = camera_branch
        self.ray_stride = (ray_stride(camera_branch.in_features, self.cfg.patch_size)
                           if camera_branch is not None else 0)

    def tokens_per_frame(self, h: int, w: int) -> int:
        return (h // self.cfg.patch_size) * (w // self.cfg.patch_size)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:  # (B, N, D) -> (B, N, H, Dh)
        return x.unflatten(2, (self.cfg.num_heads, -1))

    def text_kv(self, text: torch.Tensor) -> list[KV]:
        """Per-layer cross-attention K/V (B, H, L, Dh) of text hidden states (B, L, text_dim)."""
        context = self.wan.condition_embedder.text_embedder(text)
        out = []
        for block in self.wan.blocks:
            attn = block.attn2
            k = self._heads(attn.norm_k(attn.to_k(context))).transpose(1, 2)
            v = self._heads(attn.to_v(context)).transpose(1, 2)
            out.append((k, v))
        return out

    def forward(self, x: torch.Tensor, timesteps: torch.Tensor, camera: torch.Tensor | None,
                frame_pos: torch.Tensor, text_kv: list[KV], past_kv: list[KV] | None = None,
                mask: torch.Tensor | None = None) -> tuple[torch.Tensor, list[KV]]:
        """Velocity of `x` (B, C, T, h, w) with timesteps (B, T) in [0, 1000]."""
        wan = self.wan
        b, _, t, h, w = x.shape
        pph, ppw = h // self.cfg.patch_size, w // self.cfg.patch_size
        tpf = pph * ppw
        tokens = wan.patch_embedding(x).flatten(2).transpose(1, 2).contiguous()
        per_token = timesteps.repeat_interleave(tpf, dim=1)  # (B, N)
        ce = wan.condition_embedder  # its per-token timestep path, without the text part
        features = ce.timesteps_proj(per_token.flatten()).unflatten(0, (b, -1))
        temb = ce.time_embedder(features.to(next(ce.time_embedder.parameters()).dtype))
        temb = temb.type_as(tokens)
        proj = ce.time_proj(ce.act_fn(temb)).unflatten(2, (6, -1))  # (B, N, 6, D)
        cos, sin = rope_tables(wan, frame_pos.to(x.device), pph, ppw)
        cam = None
        if self.camera_branch is not None:
            cam = self.camera_branch.embed(camera.flatten(1, 2).to(tokens.dtype))
        new_kv = []
        for i, block in enumerate(wan.blocks):
            inject = self.camera_branch.blocks[i] if cam is not None else None
            tokens, kv = self._block(block, tokens, proj, (cos, sin), text_kv[i],
                                     past_kv[i] if past_kv else None, mask, (inject, cam))
            new_kv.append(kv)
        shift, scale = (wan.scale_shift_table.unsqueeze(0) + temb.unsqueeze(2)).chunk(2, dim=2)
        out = (wan.norm_out(tokens.float()) * (1 + scale.squeeze(2)) + shift.squeeze(2))
        out = wan.proj_out(out.type_as(tokens))
        p = self.cfg.patch_size
        out = out.reshape(b, t, pph, ppw, 1, p, p, -1).permute(0, 7, 1, 4, 2, 5, 3, 6)
        return out.flatten(6, 7).flatten(4, 5).flatten(2, 3), new_kv

    def _block(self, block: Any, x: torch.Tensor, proj: torch.Tensor,
               rope: tuple[torch.Tensor, torch.Tensor], text: KV, past: KV | None,
               mask: torch.Tensor | None, camera: tuple[Any, Any] = (None, None),
               ) -> tuple[torch.Tensor, KV]:
        """WanTransformerBlock.forward with [past + current] keys in self-attention and, with
        a camera branch, LingBot's camera modulation after the self-attention residual."""
        mods = (block.scale_shift_table.unsqueeze(0) + proj.float()).chunk(6, dim=2)
        shift, scale, gate, c_shift, c_scale, c_gate = (m.squeeze(2) for m in mods)
        h = (block.norm1(x.float()) * (1 + scale) + shift).type_as(x)
        attn = block.attn1
        q = apply_rope(self._heads(attn.norm_q(attn.to_q(h))), *rope).transpose(1, 2)
        k = apply_rope(self._heads(attn.norm_k(attn.to_k(h))), *rope).transpose(1, 2)
        v = self._heads(attn.to_v(h)).transpose(1, 2)
        k_all, v_all = k, v
        if past is not None and past[0].shape[2] > 0:
            k_all, v_all = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        a = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask)
        a = attn.to_out[0](a.transpose(1, 2).flatten(2))
        x = (x.float() + a * gate).type_as(x)
        inject, cam = camera
        if inject is not None:
            x = inject(x, cam)
        cross = block.attn2
        cq = self._heads(cross.norm_q(cross.to_q(block.norm2(x.float()).type_as(x))))
        c = F.scaled_dot_product_attention(cq.transpose(1, 2), text[0], text[1])
        x = x + cross.to_out[0](c.transpose(1, 2).flatten(2))
        h = (block.norm3(x.float()) * (1 + c_scale) + c_shift).type_as(x)
        x = (x.float() + block.ffn(h).float() * c_gate).type_as(x)
        return x, (k, v)
