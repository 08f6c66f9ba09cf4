"""Yield points between a denoiser's transformer blocks (colocated stages).

A colocated stage process (`stages.reasoner.colocate_with_generation`) runs the generation and
reasoner engines on one thread. A forward pre-hook on every repeated block of the pipeline's
denoiser(s) calls `yield_point()` (the stage's colocation, runtime/colocation.py), which runs
reasoner steps while the reasoner has work: a reasoner token then waits for one block, not a
whole denoising step. The hook reads and changes no tensor, so the generation result is the
same (tests/unit/core/test_colocation.py).

The hooks are one removable registration of their own (`BlockYieldHandle.remove()`), next to
whatever else hooks the blocks (diffusers' cache hooks, `compile_repeated_blocks`): the hook
function is excluded from `torch.compile` tracing, so a compiled block graph-breaks at it
instead of tracing the reasoner.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch

log = logging.getLogger("worldserve.levers.yielding")

DENOISER_NAMES = ("transformer", "transformer_2")
FALLBACK_BLOCK_LISTS = ("transformer_blocks", "blocks", "layers")


class BlockYieldHandle:
    """The registered hooks; `remove()` takes every one of them off again."""

    def __init__(self, handles: list[Any]) -> None:
        self._handles = handles

    @property
    def num_blocks(self) -> int:
        return len(self._handles)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def repeated_blocks(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The module's repeated blocks: the classes diffusers names in `_repeated_blocks` (what
    `compile_repeated_blocks` compiles), else the entries of a top-level block list."""
    names = set(getattr(module, "_repeated_blocks", None) or ())
    if names:
        return [m for m in module.modules() if type(m).__name__ in names]
    for attr in FALLBACK_BLOCK_LISTS:
        blocks = getattr(module, attr, None)
        if isinstance(blocks, torch.nn.ModuleList):
            return list(blocks)
    return []


def install_block_yield(pipe: Any, yield_point: Callable[[], None]) -> BlockYieldHandle:
    """Call `yield_point()` before every repeated block of the pipeline's denoiser(s)."""

    @torch.compiler.disable
    def hook(_module: torch.nn.Module, _args: Any) -> None:
        yield_point()

    handles = []
    for name in DENOISER_NAMES:
        denoiser = getattr(pipe, name, None)
        if isinstance(denoiser, torch.nn.Module):
            handles += [block.register_forward_pre_hook(hook)
                        for block in repeated_blocks(denoiser)]
    return BlockYieldHandle(handles)


class BlockYieldOps:
    """The runner side of `set_yield_point` (engines/generation/contract.py `YieldingRunner`)
    for a runner that owns a diffusers pipeline as `self.pipe`."""

    pipe: Any
    _yield_hooks: BlockYieldHandle | None = None
    # The yield point itself, for the runner's other long calls (the Cosmos3 runner's VAE
    # decode yields between latent frames); None when not colocated.
    yield_point: Callable[[], None] | None = None

    def set_yield_point(self, yield_point: Callable[[], None] | None) -> int:
        """Call `yield_point()` before every repeated block of the coming forwards (None: take
        the hooks off); the number of blocks hooked (0: the model has none)."""
        if self._yield_hooks is not None:
            self._yield_hooks.remove()
            self._yield_hooks = None
        self.yield_point = yield_point
        if yield_point is None:
            return 0
        self._yield_hooks = install_block_yield(self.pipe, yield_point)
        return self._yield_hooks.num_blocks
