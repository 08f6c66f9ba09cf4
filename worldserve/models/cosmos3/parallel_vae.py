"""Cosmos3's VAE decode (diffusers `AutoencoderKLWan`, Wan2.2 layout) split across the ranks
of a group by horizontal strips of the latent.

Each rank decodes its strip of latent rows through the same decoder, with three kinds of
layers swapped for the duration of the call (`strip_parallel`): causal 3-D convolutions with a
spatial kernel and the 2-D convolutions of the upsamplers take a one-row halo from their
neighbours (`levers/parallel/halo.py`), and the mid-block's attention (over every pixel of a
frame) gathers the strips. Every other decoder layer works per pixel. The strips of the output
are gathered on every rank. The frame cache of the causal convolutions holds each rank's own
strip, exactly as the one-device decode holds the whole frame.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from worldserve.levers.parallel.halo import gather_rows, split_rows, with_halo
from worldserve.levers.parallel.mesh import GroupHandle

HEIGHT_DIM_3D = 3  # (B, C, T, H, W)
HEIGHT_DIM_2D = 2  # (B*T, C, H, W)


class HaloCausalConv3d(nn.Module):
    """`WanCausalConv3d.forward` on a strip: the frame cache joins in time first, then the halo
    rows replace the zero rows the convolution padded above and below."""

    def __init__(self, conv: nn.Conv3d, handle: GroupHandle) -> None:
        super().__init__()
        self.conv = conv
        self.handle = handle

    def forward(self, x: torch.Tensor, cache_x: torch.Tensor | None = None) -> torch.Tensor:
        conv = self.conv
        padding = list(conv._padding)  # (w, w, h, h, 2t, 0), F.pad order
        if cache_x is not None and padding[4] > 0:
            x = torch.cat([cache_x.to(x.device), x], dim=2)
            padding[4] -= cache_x.shape[2]
        x = with_halo(x, self.handle, padding[2], HEIGHT_DIM_3D)
        padding[2] = padding[3] = 0
        return nn.Conv3d.forward(conv, F.pad(x, padding))


class HaloConv2d(nn.Module):
    """A padded 2-D convolution (the upsamplers') on a strip of frames (B*T, C, H, W)."""

    def __init__(self, conv: nn.Conv2d, handle: GroupHandle) -> None:
        super().__init__()
        self.conv = conv
        self.handle = handle

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        conv = self.conv
        pad_h, pad_w = conv.padding  # type: ignore[misc]
        x = with_halo(x, self.handle, pad_h, HEIGHT_DIM_2D)
        return F.conv2d(x, conv.weight, conv.bias, conv.stride, (0, pad_w), conv.dilation,
                        conv.groups)


class GatheredAttention(nn.Module):
    """A whole-frame attention block: run it on the gathered frame, keep this rank's rows."""

    def __init__(self, block: nn.Module, handle: GroupHandle) -> None:
        super().__init__()
        self.block = block
        self.handle = handle

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        height = x.shape[HEIGHT_DIM_3D]
        full, first = gather_rows(x, self.handle, HEIGHT_DIM_3D)
        return self.block(full).narrow(HEIGHT_DIM_3D, first, height)


def _wrapper(module: nn.Module, handle: GroupHandle) -> nn.Module | None:
    from diffusers.models.autoencoders.autoencoder_kl_wan import (
        WanAttentionBlock,
        WanCausalConv3d,
    )

    if isinstance(module, WanCausalConv3d):
        return HaloCausalConv3d(module, handle) if module._padding[2] > 0 else None
    if isinstance(module, nn.Conv2d) and module.padding[0] > 0:  # type: ignore[index]
        return HaloConv2d(module, handle)
    if isinstance(module, WanAttentionBlock):
        return GatheredAttention(module, handle)
    return None


@contextmanager
def strip_parallel(decoder: nn.Module, handle: GroupHandle) -> Iterator[None]:
    """Swap the decoder's row-mixing layers for their strip versions while the block runs
    (the model's own modules and state dict are back afterwards)."""
    swaps: list[tuple[nn.Module, str, nn.Module]] = []
    for parent in list(decoder.modules()):
        for name, child in list(parent.named_children()):
            wrapper = _wrapper(child, handle)
            if wrapper is not None:
                swaps.append((parent, name, child))
                setattr(parent, name, wrapper)
    try:
        yield
    finally:
        for parent, name, child in swaps:
            setattr(parent, name, child)


def can_split(latent_rows: int, handle: GroupHandle) -> bool:
    """Strips need a row each (the halo is one row)."""
    return handle.size > 1 and latent_rows >= handle.size


def decode_strips(vae: Any, z: torch.Tensor, handle: GroupHandle) -> torch.Tensor:
    """`vae.decode(z).sample` with the latent rows split across `handle`'s ranks; every rank
    returns the whole decoded video."""
    first, end = split_rows(z.shape[HEIGHT_DIM_3D], handle.size)[handle.index]
    strip = z.narrow(HEIGHT_DIM_3D, first, end - first)
    with strip_parallel(vae.decoder, handle):
        decoded = vae.decode(strip).sample
    return gather_rows(decoded, handle, HEIGHT_DIM_3D)[0]
