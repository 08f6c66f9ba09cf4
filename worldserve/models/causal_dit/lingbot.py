"""LingBot-World's camera branch (Robbyant/lingbot-world) on the block-causal Wan DiT.

What upstream computes, with the lines each piece follows:
- poses: c2w matrices made relative to frame 0, then frame to frame, translations divided by
  their largest norm (`wan/utils/cam_utils.py` `compute_relative_poses(framewise=True)`, :54-73);
- rays: per pixel centre (+0.5) the camera origin and the normalised view direction rotated
  into the world, `cat(origin, direction)` (`get_plucker_embeddings`, :77-112);
- tokens: each latent cell's 8 x 8 pixels folded into channels, then each 1 x 2 x 2 patch
  (`wan/image2video.py` :355-362, `wan/modules/model.py` :502-514);
- embedding: `e = p + layer2(silu(layer1(p)))`, p = `patch_embedding_wancamctrl(tokens)`
  (model.py :515-521); per block after the self-attention residual,
  `x = (1 + scale(c)) x + shift(c)` with `c = e + injector2(silu(injector1(e)))` (:256-263);
- image conditioning: 36 input channels = noise (16) + a 4-channel first-frame mask + the VAE
  latent of the image followed by zero frames (image2video.py :302-309, :367-376).

Worldserve's own rule (upstream reads `poses.npy`): held keys roll out through the shared
SANA-WM rollout (`models/camera_keys.py`); one pose per latent frame (every `upsampling`-th
output frame, as upstream samples (N - 1) / 4 + 1 poses); translations are normalised per chunk
(upstream: per clip); the rollout keeps one integer of state per session, its pitch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from worldserve.models.camera_keys import rollout_c2w

# examples/00/intrinsics.npy of the upstream repository: fx, fy, cx, cy at 832 x 480, the
# resolution upstream's intrinsics are given in (image2video.py :333-341).
DEFAULT_INTRINSICS = (502.9116, 503.10812, 415.77786, 239.77779)
DEFAULT_INTRINSICS_SIZE = (832, 480)  # width, height


class CameraInjector(nn.Module):
    """One block's camera modulation (upstream parameter names)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.cam_injector_layer1 = nn.Linear(dim, dim)
        self.cam_injector_layer2 = nn.Linear(dim, dim)
        self.cam_scale_layer = nn.Linear(dim, dim)
        self.cam_shift_layer = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        c = self.cam_injector_layer2(F.silu(self.cam_injector_layer1(e))) + e
        return (1.0 + self.cam_scale_layer(c)) * x + self.cam_shift_layer(c)


class CameraBranch(nn.Module):
    """Plücker-ray tokens -> per-token camera embedding, and the per-block injectors. Its
    state dict keys are the upstream checkpoint's (`blocks.N.cam_*` included)."""

    def __init__(self, dim: int, in_features: int, num_layers: int) -> None:
        super().__init__()
        self.patch_embedding_wancamctrl = nn.Linear(in_features, dim)
        self.c2ws_hidden_states_layer1 = nn.Linear(dim, dim)
        self.c2ws_hidden_states_layer2 = nn.Linear(dim, dim)
        self.blocks = nn.ModuleList(CameraInjector(dim) for _ in range(num_layers))

    @property
    def in_features(self) -> int:
        return self.patch_embedding_wancamctrl.in_features

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        p = self.patch_embedding_wancamctrl(tokens)
        return p + self.c2ws_hidden_states_layer2(F.silu(self.c2ws_hidden_states_layer1(p)))


def ray_stride(in_features: int, patch: int) -> int:
    """Pixels per latent cell side implied by `patch_embedding_wancamctrl` (6 s^2 p^2 inputs)."""
    stride = math.isqrt(in_features // (6 * patch * patch))
    if 6 * stride * stride * patch * patch != in_features:
        raise ValueError(f"patch_embedding_wancamctrl takes {in_features} inputs: not "
                         f"6 x s^2 x {patch}^2 for an integer s")
    return stride


# ---------------------------------------------------------------------------- geometry


def se3_inverse(poses: torch.Tensor) -> torch.Tensor:
    rot, trans = poses[:, :3, :3], poses[:, :3, 3:]
    out = torch.eye(4, dtype=poses.dtype).repeat(poses.shape[0], 1, 1)
    out[:, :3, :3] = rot.transpose(-1, -2)
    out[:, :3, 3:] = -rot.transpose(-1, -2) @ trans
    return out


def relative_poses(c2w: torch.Tensor) -> torch.Tensor:
    """Relative to the first pose, then frame to frame; translations / their largest norm."""
    rel = se3_inverse(c2w[:1]) @ c2w
    rel[0] = torch.eye(4, dtype=c2w.dtype)
    rel[1:] = se3_inverse(rel[:-1]) @ rel[1:]
    largest = rel[:, :3, 3].norm(dim=-1).max()
    if largest > 0:
        rel[:, :3, 3] = rel[:, :3, 3] / largest
    return rel


def plucker_rays(c2w: torch.Tensor, intrinsics: tuple[float, ...], height: int,
                 width: int) -> torch.Tensor:
    """(F, height, width, 6): cat(origin, unit direction) of each pixel centre's ray."""
    fx, fy, cx, cy = intrinsics
    ys, xs = torch.meshgrid(torch.arange(height, dtype=c2w.dtype),
                            torch.arange(width, dtype=c2w.dtype), indexing="ij")
    dirs = torch.stack([(xs + 0.5 - cx) / fx, (ys + 0.5 - cy) / fy, torch.ones_like(xs)], -1)
    dirs = dirs / dirs.norm(dim=-1, keepdim=True)  # (H, W, 3)
    world = torch.einsum("hwj,fij->fhwi", dirs, c2w[:, :3, :3])
    origin = c2w[:, None, None, :3, 3].expand_as(world)
    return torch.cat([origin, world], dim=-1)


def ray_tokens(rays: torch.Tensor, stride: int, patch: int) -> torch.Tensor:
    """(F, H, W, 6) rays -> (1, F, tokens per frame, 6 stride^2 patch^2), channel order
    (ray component, row in cell, column in cell, row in patch, column in patch)."""
    f, h, w, _ = rays.shape
    lh, lw = h // stride, w // stride
    cells = rays.view(f, lh, stride, lw, stride, 6).permute(0, 1, 3, 5, 2, 4)
    cells = cells.reshape(f, lh, lw, 6 * stride * stride)
    patches = cells.view(f, lh // patch, patch, lw // patch, patch, -1).permute(0, 1, 3, 5, 2, 4)
    return patches.reshape(1, f, (lh // patch) * (lw // patch), -1)


def transform_intrinsics(intrinsics: tuple[float, ...], source: tuple[int, int],
                         resized: tuple[int, int], final: tuple[int, int]) -> tuple[float, ...]:
    """[fx, fy, cx, cy] of a `source` (w, h) image resized to `resized` and centre-cropped to
    `final` (upstream `get_Ks_transformed`, cam_utils.py :115-146)."""
    fx, fy, cx, cy = intrinsics
    sx, sy = resized[0] / source[0], resized[1] / source[1]
    return (fx * sx, fy * sy, cx * sx - (resized[0] - final[0]) / 2,
            cy * sy - (resized[1] - final[1]) / 2)


def default_intrinsics(width: int, height: int) -> tuple[float, ...]:
    return transform_intrinsics(DEFAULT_INTRINSICS, DEFAULT_INTRINSICS_SIZE, (width, height),
                                (width, height))


# ---------------------------------------------------------------------------- keys -> tokens


def chunk_poses(camera: list[list[str]] | None, first: bool, frames_per_block: int,
                upsampling: int, pitch_steps: int) -> tuple[torch.Tensor, int]:
    """Frame-to-frame relative poses (frames_per_block, 4, 4) of a chunk's latent frames and
    the pitch (rotation steps) at its end.

    Output frames: the first chunk has 1 + u (F - 1) (its first is the start image), later
    ones u F; entry j of `camera` holds the keys that produced the chunk's (j + 1)-th new frame.
    Latent frame k sits at output frame u k. A later chunk's poses start from the previous
    chunk's last latent frame (kept as its pitch; yaw and position do not change relative
    poses), which is dropped after the frame-to-frame step.
    """
    steps = upsampling * (frames_per_block - 1 if first else frames_per_block)
    c2w, end_pitch = rollout_c2w(camera, steps, pitch_steps)
    latent = torch.from_numpy(c2w[::upsampling]).to(torch.float64)
    rel = relative_poses(latent)
    return (rel if first else rel[1:]), end_pitch


def chunk_camera_tokens(camera: list[list[str]] | None, first: bool, frames_per_block: int,
                        upsampling: int, pitch_steps: int, intrinsics: tuple[float, ...],
                        height: int, width: int, stride: int,
                        patch: int) -> tuple[torch.Tensor, int]:
    """The camera branch's input for one chunk (1, F, tokens per frame, features) and the
    pitch at its end."""
    rel, end_pitch = chunk_poses(camera, first, frames_per_block, upsampling, pitch_steps)
    rays = plucker_rays(rel, intrinsics, height, width)
    return ray_tokens(rays, stride, patch).float(), end_pitch
