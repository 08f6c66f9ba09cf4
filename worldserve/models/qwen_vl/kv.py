"""A dense per-sequence KV cache with its token ids and (3-axis) positions kept in lockstep."""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

MIN_CAPACITY = 256


class GrowableLayer(DynamicLayer):
    """A dense cache layer with spare capacity: appending a token writes in place instead of
    copying the whole cache (`DynamicLayer` concatenates on every update, O(length) per token).

    `keys` / `values` are views of the filled part; assigning them (what eviction and
    transformers' own helpers do) replaces the buffer.
    """

    def __init__(self, **kwargs: Any) -> None:
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self.length = 0
        super().__init__(**kwargs)

    @property  # type: ignore[override]
    def keys(self) -> torch.Tensor | None:
        return None if self._k is None else self._k[:, :, : self.length]

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        self._k = value
        self.length = 0 if value is None else value.shape[-2]

    @property  # type: ignore[override]
    def values(self) -> torch.Tensor | None:
        return None if self._v is None else self._v[:, :, : self.length]

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        self._v = value

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.is_initialized = True

    def reserve(self, key_states: torch.Tensor, value_states: torch.Tensor, capacity: int) -> None:
        """Make room for `capacity` tokens shaped like `key_states` (keeps the filled part)."""
        if self._k is not None and self._k.shape[-2] >= capacity:
            return
        capacity = max(capacity, MIN_CAPACITY)
        k_shape = (*key_states.shape[:2], capacity, key_states.shape[-1])
        v_shape = (*value_states.shape[:2], capacity, value_states.shape[-1])
        new_k = key_states.new_empty(k_shape)
        new_v = value_states.new_empty(v_shape)
        if self.length:
            new_k[:, :, : self.length] = self._k[:, :, : self.length]
            new_v[:, :, : self.length] = self._v[:, :, : self.length]
        self._k, self._v = new_k, new_v

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if self._k is None or end > self._k.shape[-2] or self._k.shape[0] != key_states.shape[0]:
            self.reserve(key_states, value_states, 2 * end)
        self._k[:, :, self.length:end] = key_states
        self._v[:, :, self.length:end] = value_states
        self.length = end
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)

    @torch.inference_mode()
    def evict(self, start: int, end: int) -> None:
        """Drop [start, end): the tail moves down in place."""
        tail = self.length - end
        if tail > 0:
            self._k[:, :, start:start + tail] = self._k[:, :, end:self.length].clone()
            self._v[:, :, start:start + tail] = self._v[:, :, end:self.length].clone()
        self.length -= end - start


def new_cache(config: Any) -> DynamicCache:
    """A DynamicCache whose full-attention layers grow in place."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowableLayer() if type(layer) is DynamicLayer else layer
                    for layer in cache.layers]
    return cache


class KVState:
    """The cache of one sequence (a session or a chat request).

    `ids[i]` and `positions[:, i]` describe cached token i. Positions are never rewritten:
    evicting a range leaves a gap in the position space (RoPE only sees differences).
    """

    def __init__(self, config: Any) -> None:
        self._config = config
        self.cache = new_cache(config)
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

    @torch.inference_mode()
    def evict(self, start: int, end: int) -> None:
        """Drop cached tokens [start, end) from every layer, the ids and the positions."""
        for layer in self.cache.layers:
            if isinstance(layer, GrowableLayer):
                layer.evict(start, end)
            elif getattr(layer, "keys", None) is not None and layer.keys.numel():
                keys = torch.cat([layer.keys[:, :, :start], layer.keys[:, :, end:]], dim=2)
                values = torch.cat([layer.values[:, :, :start], layer.values[:, :, end:]], dim=2)
                layer.keys, layer.values = keys, values
        del self.ids[start:end]
        self.positions = torch.cat([self.positions[:, :start], self.positions[:, end:]], dim=1)

    def truncate(self, length: int) -> None:
        """Keep the first `length` tokens (rolls back rejected speculative tokens)."""
        removed = len(self.ids) - length
        if removed <= 0:
            return
        for layer in self.cache.layers:
            if isinstance(layer, GrowableLayer):
                layer.truncate(length)
            elif getattr(layer, "keys", None) is not None and layer.keys.numel():
                layer.keys = layer.keys[:, :, :length]
                layer.values = layer.values[:, :, :length]
        del self.ids[length:]
        self.positions = self.positions[:, :length]
        self.next_pos = int(self.positions.max()) + 1 if length else 0

    def reset(self) -> None:
        """Drop everything (re-prefill starts from position 0)."""
        self.cache = new_cache(self._config)
        self.ids = []
        self.positions = torch.zeros(3, 0, dtype=torch.long)
        self.next_pos = 0
