"""`AutoencoderKLWan` decode a few latent frames at a time, equal to one `vae.decode(z)`.

The Wan VAE decoder is causal in time: `_decode` runs the decoder one latent frame at a time,
carrying each causal conv's last frames in a feature cache (`feat_cache`, one slot per
`WanCausalConv3d`). `vae.decode()` keeps that cache on the shared VAE object and clears it on
every call, so it cannot be paused. `WanDecodeJob` keeps its own cache list and drives the same
modules in the same order as `_decode` (untiled) or `tiled_decode` (spatial tiles, each with a
cache of its own, blended at the end), so a long decode can be spread over several engine steps
with other jobs' work in between, and the result is bit-equal to one `vae.decode(z).sample`
(diffusers 0.42.1 internals, pinned; tests/unit/generation/test_vae_decode.py checks it).

Tiling: `configure_tiling` calls `vae.enable_tiling()`; tiles are decoded tile-major, so only
one tile's feature cache is alive at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

# `AutoencoderKLWan`'s own tile size and stride (output pixels, diffusers 0.42.1 __init__);
# `enable_tiling(None)` would keep whatever an earlier call set instead.
WAN_TILE_SIZE = 256
WAN_TILE_STRIDE = 192


@dataclass(frozen=True)
class TilingOptions:
    """`AutoencoderKLWan.enable_tiling` sizes in output pixels (None: the VAE's own, 256/192)."""

    tile_size: int | None = None
    tile_stride: int | None = None


def configure_tiling(vae: Any, options: TilingOptions | None) -> dict[str, Any]:
    """Turn the VAE's spatial tiling on (or off with None); what is in force, for model_info."""
    if options is None:
        vae.disable_tiling()
        return {"tiling": False}
    size = options.tile_size or WAN_TILE_SIZE
    stride = options.tile_stride or WAN_TILE_STRIDE
    vae.enable_tiling(tile_sample_min_height=size, tile_sample_min_width=size,
                      tile_sample_stride_height=stride, tile_sample_stride_width=stride)
    ratio = int(vae.spatial_compression_ratio)
    for name, value in (("vae_tile_size", vae.tile_sample_min_height),
                        ("vae_tile_stride", vae.tile_sample_stride_height)):
        if value % ratio:
            raise ValueError(f"{name} {value} is not a multiple of the VAE's spatial factor "
                             f"{ratio} (tiles are cut in latent pixels)")
    if vae.tile_sample_stride_height > vae.tile_sample_min_height:
        raise ValueError(f"vae_tile_stride {vae.tile_sample_stride_height} is larger than "
                         f"vae_tile_size {vae.tile_sample_min_height}: tiles would leave gaps")
    return {"tiling": True, "tile_size": int(vae.tile_sample_min_height),
            "tile_stride": int(vae.tile_sample_stride_height)}


@dataclass
class _Tile:
    """One spatial tile (latent origin) and its decoded frames so far."""

    top: int
    left: int
    frames: list[torch.Tensor] = field(default_factory=list)


class WanDecodeJob:
    """The decode of one latent video `z` (B, z_dim, T, h, w), advanced `advance(n)` latent
    frames (per tile) at a time; `result()` then equals `vae.decode(z).sample`."""

    def __init__(self, vae: Any, z: torch.Tensor) -> None:
        self.vae = vae
        self.z = z
        self.num_frames = int(z.shape[2])
        height, width = int(z.shape[3]), int(z.shape[4])
        ratio = vae.spatial_compression_ratio
        self._tile_h = vae.tile_sample_min_height // ratio
        self._tile_w = vae.tile_sample_min_width // ratio
        self.tiled = bool(vae.use_tiling) and (width > self._tile_w or height > self._tile_h)
        if self.tiled:  # tiled_decode's tile origins, row by row
            step_h = vae.tile_sample_stride_height // ratio
            step_w = vae.tile_sample_stride_width // ratio
            self.tiles = [_Tile(i, j) for i in range(0, height, step_h)
                          for j in range(0, width, step_w)]
            self._x = None
        else:  # _decode runs post_quant_conv over the whole video first
            self.tiles = [_Tile(0, 0)]
            self._x = vae.post_quant_conv(z)
        self._tile_index = 0
        self._cache = self._fresh_cache()

    @property
    def done(self) -> bool:
        return self._tile_index >= len(self.tiles)

    @property
    def num_units(self) -> int:
        """Latent frames to decode in all (frames x tiles): the job's length."""
        return self.num_frames * len(self.tiles)

    def _fresh_cache(self) -> list[Any]:
        return [None] * self.vae._cached_conv_counts["decoder"]

    def advance(self, max_frames: int) -> bool:
        """Decode up to `max_frames` more latent frames of the current tile (a tile never
        shares a call with the next one); True when the whole video is decoded."""
        if self.done:
            return True
        tile = self.tiles[self._tile_index]
        start = len(tile.frames)
        for k in range(start, min(self.num_frames, start + max(1, max_frames))):
            tile.frames.append(self._decode_frame(tile, k))
        if len(tile.frames) == self.num_frames:
            self._tile_index += 1
            self._cache = self._fresh_cache()
        return self.done

    def _decode_frame(self, tile: _Tile, k: int) -> torch.Tensor:
        vae = self.vae
        if self._x is not None:
            x = self._x[:, :, k:k + 1]
        else:
            x = vae.post_quant_conv(self.z[:, :, k:k + 1, tile.top:tile.top + self._tile_h,
                                           tile.left:tile.left + self._tile_w])
        return vae.decoder(x, feat_cache=self._cache, feat_idx=[0], first_chunk=(k == 0))

    def result(self) -> torch.Tensor:
        """(B, 3, T_out, H, W) in [-1, 1], as `vae.decode(z).sample`."""
        if not self.done:
            raise RuntimeError("the decode has frames left: call advance() until it is done")
        vae = self.vae
        if self.tiled:
            out = self._blend()
        else:
            out = torch.cat(self.tiles[0].frames, dim=2)
        if vae.config.patch_size is not None:
            from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

            out = unpatchify(out, patch_size=vae.config.patch_size)
        return torch.clamp(out, min=-1.0, max=1.0)

    def _blend(self) -> torch.Tensor:
        """`tiled_decode`'s seam blending, on the finished tiles."""
        vae = self.vae
        height, width = int(self.z.shape[3]), int(self.z.shape[4])
        patch = vae.config.patch_size or 1
        sample_h = height * vae.spatial_compression_ratio // patch
        sample_w = width * vae.spatial_compression_ratio // patch
        stride_h = vae.tile_sample_stride_height // patch
        stride_w = vae.tile_sample_stride_width // patch
        blend_h = vae.tile_sample_min_height // patch - stride_h
        blend_w = vae.tile_sample_min_width // patch - stride_w
        per_row = len({tile.left for tile in self.tiles})
        grid = [[torch.cat(t.frames, dim=2) for t in self.tiles[r:r + per_row]]
                for r in range(0, len(self.tiles), per_row)]
        result_rows = []
        for i, row in enumerate(grid):
            result_row = []
            for j, tile in enumerate(row):
                if i > 0:
                    tile = vae.blend_v(grid[i - 1][j], tile, blend_h)
                if j > 0:
                    tile = vae.blend_h(row[j - 1], tile, blend_w)
                result_row.append(tile[:, :, :, :stride_h, :stride_w])
            result_rows.append(torch.cat(result_row, dim=-1))
        return torch.cat(result_rows, dim=3)[:, :, :, :sample_h, :sample_w]
