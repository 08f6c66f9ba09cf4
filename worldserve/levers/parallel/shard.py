"""Sharded weights for a stack of blocks (FSDP2's per-parameter dim-0 sharding, for inference).

Every parameter of a block is cut into `K` row ranges (dim 0, the last one padded); rank i of
the shard group keeps range i, concatenated with the block's other parameters into one flat
buffer per dtype (a non-persistent buffer of the block, so `.to(device)` moves it and the
state dict never sees it). The parameters themselves hold an empty placeholder. A forward
pre-hook all-gathers the block's buffers and points each parameter at its full rows; a forward
hook (also on error) puts the placeholders back. So a rank holds 1/K of the blocks' weights
plus one gathered block at a time; every rank of the group must run the same block forwards
in the same order (they do: each runs the same step).

Rows can come from a loaded module (`from_module`) or straight from the checkpoint
(`from_reader`, which reads only this rank's rows: the generator never exists whole on any
rank).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from worldserve.levers.parallel.comm import all_gather
from worldserve.levers.parallel.mesh import GroupHandle

# (parameter name within the block, first row, end row) -> those rows of the full tensor
RowReader = Callable[[str, int, int], torch.Tensor]
BUFFER_PREFIX = "_shard_rows_"


def row_range(num_rows: int, handle: GroupHandle) -> tuple[int, int, int]:
    """(first, end, rows per rank) of this rank's dim-0 range of a `num_rows` tensor."""
    per = max(1, math.ceil(num_rows / handle.size))
    first = min(num_rows, handle.index * per)
    return first, min(num_rows, first + per), per


@dataclass
class _Slot:
    param: nn.Parameter
    shape: tuple[int, ...]  # the full (logical) shape
    per: int  # rows per rank
    row_numel: int
    offset: int  # into this dtype's flat buffer

    @property
    def numel(self) -> int:
        return self.per * self.row_numel


class ShardedBlock:
    """One block's parameters, sharded over `handle`'s ranks."""

    def __init__(self, block: nn.Module, handle: GroupHandle, read_rows: RowReader, *,
                 dtype: torch.dtype | None = None, device: torch.device | None = None) -> None:
        """`dtype` / `device`: where this rank's rows live (default: the parameter's own;
        required for parameters on the meta device)."""
        self.block = block
        self.handle = handle
        self.slots: dict[torch.dtype, list[_Slot]] = {}
        pieces: dict[torch.dtype, list[torch.Tensor]] = {}
        for name, param in list(block.named_parameters()):
            kind = dtype or param.dtype
            logical = tuple(param.shape)
            shape = logical or (1,)
            first, end, per = row_range(shape[0], handle)
            rows = torch.zeros((per, *shape[1:]), dtype=kind, device=device or param.device)
            rows[: end - first] = read_rows(name, first, end).reshape(end - first, *shape[1:])
            slots = self.slots.setdefault(kind, [])
            offset = sum(s.numel for s in slots)
            holder = _hold(block, name, param, rows)
            slots.append(_Slot(holder, logical, per, math.prod(shape[1:]), offset))
            pieces.setdefault(kind, []).append(rows.flatten())
        for dtype, parts in pieces.items():
            block.register_buffer(_buffer_name(dtype), torch.cat(parts), persistent=False)
        self.num_params = sum(math.prod(s.shape) for group in self.slots.values() for s in group)
        block.register_forward_pre_hook(lambda *_: self.gather())
        block.register_forward_hook(lambda *_: self.release(), always_call=True)

    def gather(self) -> None:
        for dtype, slots in self.slots.items():
            local = getattr(self.block, _buffer_name(dtype))
            gathered = all_gather(local, self.handle)  # (K, rows of every parameter)
            for slot in slots:
                rows = gathered[:, slot.offset:slot.offset + slot.numel]
                full = rows.reshape(self.handle.size * slot.per, -1)[: slot.shape[0] if
                                                                    slot.shape else 1]
                slot.param.data = full.reshape(slot.shape)

    def release(self) -> None:
        for slots in self.slots.values():
            for slot in slots:
                slot.param.data = _placeholder(slot.param)

    def local_bytes(self) -> int:
        return sum(getattr(self.block, _buffer_name(d)).nbytes for d in self.slots)


class ShardedBlocks:
    """Every block of a stack sharded over one group."""

    def __init__(self, blocks: list[ShardedBlock]) -> None:
        self.blocks = blocks

    @classmethod
    def from_module(cls, blocks: Sequence[nn.Module], handle: GroupHandle) -> ShardedBlocks:
        """Shard blocks whose full weights are loaded (each rank then frees the rest)."""
        out = []
        for block in blocks:
            full = {name: p.data for name, p in block.named_parameters()}
            out.append(ShardedBlock(block, handle,
                                    lambda name, a, b, full=full: _rows(full[name], a, b)))
        return cls(out)

    @classmethod
    def from_reader(cls, blocks: Sequence[nn.Module], handle: GroupHandle,
                    readers: Sequence[RowReader], *, dtype: torch.dtype,
                    device: torch.device) -> ShardedBlocks:
        """Shard blocks whose parameters are on the meta device, reading only this rank's
        rows of each from the checkpoint."""
        return cls([ShardedBlock(block, handle, read, dtype=dtype, device=device)
                    for block, read in zip(blocks, readers)])

    @property
    def num_params(self) -> int:
        return sum(block.num_params for block in self.blocks)

    def local_bytes(self) -> int:
        return sum(block.local_bytes() for block in self.blocks)

    def describe(self) -> dict[str, Any]:
        return {"blocks": len(self.blocks), "params": self.num_params,
                "local_bytes": self.local_bytes()}


def _rows(tensor: torch.Tensor, first: int, end: int) -> torch.Tensor:
    return (tensor.reshape(1) if tensor.dim() == 0 else tensor)[first:end]


def _hold(block: nn.Module, name: str, param: nn.Parameter,
          rows: torch.Tensor) -> nn.Parameter:
    """The parameter, now holding an empty placeholder of the rows' dtype and device (a new
    Parameter object where the old one cannot take it: meta, another dtype or device)."""
    placeholder = torch.empty(0, dtype=rows.dtype, device=rows.device)
    if param.dtype == rows.dtype and param.device == rows.device:
        param.data = placeholder
        return param
    owner_name, _, leaf = name.rpartition(".")
    owner = block.get_submodule(owner_name) if owner_name else block
    holder = nn.Parameter(placeholder, requires_grad=False)
    owner._parameters[leaf] = holder
    return holder


def _placeholder(param: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=param.dtype, device=param.device)


def _buffer_name(dtype: torch.dtype) -> str:
    return BUFFER_PREFIX + str(dtype).removeprefix("torch.")
