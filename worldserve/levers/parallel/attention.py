"""Sequence-parallel attention pieces: Ulysses (all-to-all from sequence chunks to head groups
and back) and Ring (each rank's queries meet every chunk's keys, one neighbour exchange per
chunk, partial results merged by log-sum-exp).

Tensors are (tokens, heads, head_dim) here, the layout of the packed Cosmos3 sequence.
"""

from __future__ import annotations

import torch

from worldserve.levers.parallel.comm import all_to_all, ring_shift_start
from worldserve.levers.parallel.mesh import GroupHandle


def scatter_heads(x: torch.Tensor, handle: GroupHandle) -> torch.Tensor:
    """(chunk, H, D) on each rank -> (size * chunk, H / size, D): every rank's chunk, in axis
    order, for this rank's group of heads."""
    return scatter_heads_many([x], handle)[0]


def scatter_heads_many(tensors: list[torch.Tensor], handle: GroupHandle) -> list[torch.Tensor]:
    """`scatter_heads` of several (chunk, H_i, D) tensors in one all-to-all."""
    size = handle.size
    if size == 1:
        return tensors
    chunk, dim = tensors[0].shape[0], tensors[0].shape[2]
    widths = [t.shape[1] // size for t in tensors]
    parts = torch.cat([t.reshape(chunk, size, w, dim).permute(1, 0, 2, 3)
                       for t, w in zip(tensors, widths)], dim=2)  # (size, chunk, sum H/s, D)
    out = all_to_all(parts, handle)
    return [piece.reshape(size * chunk, w, dim)
            for piece, w in zip(out.split(widths, dim=2), widths)]


def gather_heads(x: torch.Tensor, handle: GroupHandle) -> torch.Tensor:
    """The inverse of `scatter_heads`: (size * chunk, H / size, D) -> (chunk, H, D)."""
    size = handle.size
    if size == 1:
        return x
    tokens, heads, dim = x.shape
    parts = x.view(size, tokens // size, heads, dim)  # slice i: rank i's chunk, my heads
    out = all_to_all(parts, handle)  # slice j: my chunk, rank j's heads
    return out.permute(1, 0, 2, 3).reshape(tokens // size, size * heads, dim)


def head_slice(x: torch.Tensor, handle: GroupHandle) -> torch.Tensor:
    """This rank's group of heads of a replicated (tokens, H, D) tensor."""
    per = x.shape[1] // handle.size
    return x[:, handle.index * per:(handle.index + 1) * per]


def repeat_kv(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """GQA key/value heads repeated to `num_heads` (what `enable_gqa` does implicitly)."""
    groups = num_heads // x.shape[1]
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def attention_lse(q: torch.Tensor, k: torch.Tensor,
                  v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Full (non-causal) attention and its log-sum-exp: q (Lq, H, D), k/v (Lk, H, D) ->
    out (Lq, H, D), lse (Lq, H) in float32."""
    qh, kh, vh = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # (1, H, L, D)
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qh, kh, vh)[:2]
    elif q.device.type == "cuda":  # unverified here (no GPU in CI)
        kernel = CUDA_KERNELS[ring_kernel(q.dtype, q.shape[-1], _capability(q.device))]
        out, lse = kernel(qh, kh, vh)
        lse = lse.narrow(-1, 0, q.shape[0])  # mem-efficient pads its lse rows to 32s
    else:
        scale = q.shape[-1] ** -0.5
        scores = (qh.float() @ kh.float().transpose(-1, -2)) * scale
        lse = torch.logsumexp(scores, dim=-1)
        out = (torch.softmax(scores, dim=-1) @ vh.float()).to(q.dtype)
    return out.squeeze(0).transpose(0, 1), lse.squeeze(0).transpose(0, 1).float()


FLASH_MIN_CAPABILITY = (8, 0)  # FlashAttention-2 in torch: Ampere and later
FLASH_MAX_HEAD_DIM = 256


def ring_kernel(dtype: torch.dtype, head_dim: int, capability: tuple[int, int]) -> str:
    """The CUDA kernel a ring hop runs: FlashAttention-2 where torch has it (fp16 / bf16, head
    dim a multiple of 8 up to 256, sm80+), else mem-efficient (any dtype; ~1.5-2x slower on an
    H100 by the published kernel figures). Both return the output (B, H, L, D) and a float32
    log-sum-exp (B, H, L) (mem-efficient's padded to a multiple of 32): the layout torch's own
    context-parallel merger reads from either (torch/distributed/tensor/experimental/
    _context_parallel/_attention.py, `_SDPAMerger`) and the one `merge_lse` takes. Shapes are
    tested under fake CUDA tensors; no GPU ran either kernel here."""
    if (dtype in (torch.float16, torch.bfloat16) and head_dim % 8 == 0
            and head_dim <= FLASH_MAX_HEAD_DIM and capability >= FLASH_MIN_CAPABILITY):
        return "flash"
    return "efficient"


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(torch.ops.aten._scaled_dot_product_flash_attention(q, k, v)[:2])


def _efficient(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True)[:2])


CUDA_KERNELS = {"flash": _flash, "efficient": _efficient}  # (B, H, L, D) -> out, lse


def _capability(device: torch.device) -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]


def merge_lse(out: torch.Tensor | None, lse: torch.Tensor | None, block_out: torch.Tensor,
              block_lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine two partial softmax-attention results over disjoint key sets (float32)."""
    block_out = block_out.float()
    if out is None or lse is None:
        return block_out, block_lse
    new_lse = torch.logaddexp(lse, block_lse)
    out = out * torch.exp(lse - new_lse).unsqueeze(-1) \
        + block_out * torch.exp(block_lse - new_lse).unsqueeze(-1)
    return out, new_lse


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, handle: GroupHandle,
                   valid_keys: list[int], prefix: tuple[torch.Tensor, torch.Tensor] | None = None
                   ) -> torch.Tensor:
    """Queries `q` (this rank's chunk) against the keys of every rank's chunk plus an optional
    replicated `prefix` (k, v). k/v chunks are padded to one size; `valid_keys[i]` rows of
    ring position i's chunk are real. k/v may carry fewer (GQA) heads than q: they travel the
    ring as they are and are repeated to q's heads only where attention reads them, so a hop
    moves `kv_heads / heads` of the bytes a repeated tensor would."""
    heads = q.shape[1]
    out, lse = None, None
    if prefix is not None and prefix[0].shape[0] > 0:
        out, lse = merge_lse(out, lse, *attention_lse(
            q, repeat_kv(prefix[0], heads), repeat_kv(prefix[1], heads)))
    kv = torch.stack((k, v))  # one exchange per hop carries both
    pending = None
    for hop in range(handle.size):
        owner = (handle.index - hop) % handle.size
        if pending is not None:
            kv = pending.wait()
        # pass the chunk on while attending to it: the next hop's exchange overlaps this one's
        # compute (both only read `kv`)
        pending = ring_shift_start(kv, handle) if hop + 1 < handle.size else None
        n = valid_keys[owner]
        if n > 0:
            out, lse = merge_lse(out, lse, *attention_lse(
                q, repeat_kv(kv[0, :n], heads), repeat_kv(kv[1, :n], heads)))
    assert out is not None  # the prefix or this rank's own chunk always has keys
    return out.to(q.dtype)
