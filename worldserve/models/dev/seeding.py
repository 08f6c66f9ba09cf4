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
