"""Strip parallelism for convolutional decoders: each rank holds a horizontal strip of rows;
a convolution with a k x k kernel first takes the (k - 1) / 2 rows each neighbour holds next to
its edge (the halo; zeros at the picture's own edges, which is the zero padding the convolution
had), so every output row is computed from the same input rows as on one device. Layers that
mix all rows (attention over the picture) gather the strips first.
"""

from __future__ import annotations

import torch

from worldserve.levers.parallel.comm import all_gather
from worldserve.levers.parallel.mesh import GroupHandle


def split_rows(num_rows: int, parts: int) -> list[tuple[int, int]]:
    """`parts` contiguous (first, end) ranges covering `num_rows`, sizes differing by <= 1."""
    base, extra = divmod(num_rows, parts)
    out, first = [], 0
    for i in range(parts):
        end = first + base + (1 if i < extra else 0)
        out.append((first, end))
        first = end
    return out


def with_halo(x: torch.Tensor, handle: GroupHandle, rows: int, dim: int) -> torch.Tensor:
    """`x` (this rank's strip along `dim`) extended by `rows` rows of each neighbour's strip
    (zeros beyond the first and last strip). Every strip must hold at least `rows` rows."""
    if rows == 0:
        return x
    if x.shape[dim] < rows:
        raise ValueError(f"a strip of {x.shape[dim]} rows cannot lend a halo of {rows}")
    edges = torch.stack((x.narrow(dim, 0, rows), x.narrow(dim, x.shape[dim] - rows, rows)))
    gathered = all_gather(edges, handle)  # (ranks, 2 = top/bottom, ...)
    zeros = torch.zeros_like(edges[0])
    above = gathered[handle.index - 1, 1] if handle.index > 0 else zeros
    below = gathered[handle.index + 1, 0] if handle.index < handle.size - 1 else zeros
    return torch.cat((above, x, below), dim=dim)


def gather_rows(x: torch.Tensor, handle: GroupHandle, dim: int) -> tuple[torch.Tensor, int]:
    """Every rank's strip concatenated along `dim` (strips may differ in height), and where
    this rank's strip starts in it."""
    height = torch.tensor([x.shape[dim]], dtype=torch.int64, device=x.device)
    heights = [int(h) for h in all_gather(height, handle).flatten()]
    tallest = max(heights)
    padded = x
    if x.shape[dim] < tallest:
        pad_shape = list(x.shape)
        pad_shape[dim] = tallest - x.shape[dim]
        padded = torch.cat((x, x.new_zeros(pad_shape)), dim=dim)
    gathered = all_gather(padded, handle)
    strips = [gathered[i].narrow(dim, 0, h) for i, h in enumerate(heights)]
    return torch.cat(strips, dim=dim), sum(heights[: handle.index])
