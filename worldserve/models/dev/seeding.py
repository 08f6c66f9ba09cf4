"""Seeded, side-effect-free weight initialisation for the dev builders."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager

import torch


def component_seed(seed: int, component: str) -> int:
    """A seed for one component, derived from the build seed and the component's name.

    Each component draws from its own stream, so resizing one never changes another's weights.
    """
    digest = hashlib.sha256(f"{seed}:{component}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


@contextmanager
def seeded(seed: int, component: str) -> Iterator[None]:
    """Run the block with torch's CPU RNG seeded for `component`; restore the caller's RNG after."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(component_seed(seed, component))
        yield


@torch.no_grad()
def spread_norm_weights(module: torch.nn.Module, spread: float = 0.25) -> None:
    """Draw every normalisation weight of `module` from U(1 - spread, 1 + spread).

    Freshly built norms are all 1.0, so a weight mapping that swaps two norms of one shape
    (input vs post-attention layernorm, q vs k norm) would copy equal tensors and go unnoticed;
    with distinct weights every norm is told apart. Call it inside `seeded(...)`.
    """
    for submodule in module.modules():
        weight = getattr(submodule, "weight", None)
        if "Norm" in type(submodule).__name__ and isinstance(weight, torch.nn.Parameter):
            weight.uniform_(1.0 - spread, 1.0 + spread)
