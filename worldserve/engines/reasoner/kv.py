"""A dense per-sequence KV cache with its token ids and (3-axis) positions kept in lockstep."""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache


class KVState:
    """The cache of one sequence (a session or a chat request).

    `ids[i]` and `positions[:, i]` describe cached token i. Positions are never rewritten:
    evicting a range leaves a gap in the position space (RoPE only sees differences).
    """

    def __init__(self, config: Any) -> None:
        self._config = config
        self.cache = DynamicCache(config=config)
        self.ids: list[int] = []
        self.positions = torch.zeros(3, 0, dtype=torch.long)  # (3, N)
        self.next_pos = 0  # the next free position (all axes)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def max_position(self) -> int:
        return self.next_pos - 1

    def record(self, ids: list[int], positions: torch.Tensor) -> None:
        """Bookkeeping after a forward appended `ids` at `positions` (3, T) to the cache."""
        self.ids.extend(ids)
        self.positions = torch.cat([self.positions, positions.cpu()], dim=1)
        self.next_pos = max(self.next_pos, int(positions.max()) + 1)

    def evict(self, start: int, end: int) -> None:
        """Drop cached tokens [start, end) from every layer, the ids and the positions."""
        for layer in self.cache.layers:
            if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
                continue
            layer.keys = torch.cat([layer.keys[:, :, :start], layer.keys[:, :, end:]], dim=2)
            layer.values = torch.cat([layer.values[:, :, :start], layer.values[:, :, end:]], dim=2)
        del self.ids[start:end]
        self.positions = torch.cat([self.positions[:, :start], self.positions[:, end:]], dim=1)

    def truncate(self, length: int) -> None:
        """Keep the first `length` tokens (rolls back rejected speculative tokens)."""
        removed = len(self.ids) - length
        if removed <= 0:
            return
        for layer in self.cache.layers:
            if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
                continue
            layer.keys = layer.keys[:, :, :length]
            layer.values = layer.values[:, :, :length]
        del self.ids[length:]
        self.positions = self.positions[:, :length]
        self.next_pos = int(self.positions.max()) + 1 if length else 0

    def reset(self) -> None:
        """Drop everything (re-prefill starts from position 0)."""
        self.cache = DynamicCache(config=self._config)
        self.ids = []
        self.positions = torch.zeros(3, 0, dtype=torch.long)
        self.next_pos = 0
