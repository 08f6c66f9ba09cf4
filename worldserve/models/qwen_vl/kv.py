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
        # zeros, not empty: a static step attends over whole buffers (masked), and 0 x NaN of
        # uninitialised memory would still poison its output
        new_k = key_states.new_zeros(k_shape)
        new_v = value_states.new_zeros(v_shape)
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

    def advance(self, num_tokens: int) -> None:
        """Keep `num_tokens` more of the tokens a step wrote into the layers' buffers."""
        for layer in self.cache.layers:
            layer.length += num_tokens

    def record_next(self, ids: list[int]) -> None:
        """`record` of text tokens a decode step appended at the next positions (the three
        axes agree), from Python ints: a decode step reads no tensor back."""
        start = self.next_pos
        self.ids.extend(ids)
        positions = torch.arange(start, start + len(ids)).expand(3, -1)
        self.positions = torch.cat([self.positions, positions], dim=1)
        self.next_pos = start + len(ids)

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


def packed_capacity(tokens: int) -> int:
    """Rows of a packed batch get half their need again as headroom (repacking is rare)."""
    return max(MIN_CAPACITY, tokens + tokens // 2)


class PackedLayer(DynamicLayer):
    """One layer of a `PackedBatch`: (B, H, capacity, D) buffers. Row b's new tokens are
    written at row b's own length (set by `prepare`), not at a shared offset."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.device = keys.device
        self.is_initialized = True
        self.k_buf, self.v_buf = keys, values
        self._index: torch.Tensor | None = None
        self._longest = 0

    def prepare(self, index: torch.Tensor, longest: int, width: int) -> None:
        """This step writes row b's tokens at `index[b]` (B, W); attention reads
        [0, longest + width) of every row (the mask hides what a row does not own)."""
        b, h, _, d = self.k_buf.shape
        self._index = index.view(b, 1, width, 1).expand(b, h, width, d)
        self._longest = longest
        self.keys = self.k_buf[:, :, : longest + width]
        self.values = self.v_buf[:, :, : longest + width]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        assert self._index is not None, "PackedBatch.prepare() was not called"
        self.k_buf.scatter_(2, self._index, key_states)
        self.v_buf.scatter_(2, self._index, value_states)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._longest


class PackedBatch:
    """The caches of several sequences resident in one batch buffer per layer, kept across
    consecutive decode steps.

    Packing moves each member's filled K/V into row b of the batch buffers and points the
    member's own `GrowableLayer`s at that row (a view), so a batched step writes each member's
    new K/V in place and nothing is copied back. What a member does alone (prefill of its next
    frame, eviction, speculative truncation) also works on the row in place. A member is
    *detached* once its layer buffers are replaced (the row outgrown, a reset or re-prefill);
    `matches` then fails and the runner packs anew. Members that leave the batch get their own
    buffers back (`release`).
    """

    def __init__(self, config: Any, kvs: list[KVState], width: int) -> None:
        self.kvs = list(kvs)
        self.capacity = packed_capacity(max(len(kv) for kv in kvs) + width)
        self.cache = DynamicCache(config=config)
        self.cache.layers = [self._pack_layer(i) for i in range(len(kvs[0].cache.layers))]
        self._caches = [kv.cache for kv in self.kvs]
        self._views = [[layer._k for layer in kv.cache.layers] for kv in self.kvs]
        self.rows = {id(kv): b for b, kv in enumerate(self.kvs)}

    def _pack_layer(self, index: int) -> PackedLayer:
        first = self.kvs[0].cache.layers[index]
        batch = len(self.kvs)
        k_shape = (batch, first._k.shape[1], self.capacity, first._k.shape[-1])
        v_shape = (batch, first._v.shape[1], self.capacity, first._v.shape[-1])
        # zeros, not empty: unowned slots are masked, but 0 x NaN would still poison the output
        keys, values = first._k.new_zeros(k_shape), first._v.new_zeros(v_shape)
        for b, kv in enumerate(self.kvs):
            layer = kv.cache.layers[index]
            keys[b, :, : layer.length] = layer._k[0, :, : layer.length]
            values[b, :, : layer.length] = layer._v[0, :, : layer.length]
            layer._k, layer._v = keys[b:b + 1], values[b:b + 1]
        return PackedLayer(keys, values)

    @staticmethod
    def supports(kvs: list[KVState]) -> bool:
        """Packing needs every layer to be a non-empty `GrowableLayer` (full attention)."""
        return all(isinstance(layer, GrowableLayer) and layer._k is not None
                   for kv in kvs for layer in kv.cache.layers)

    def attached(self, b: int) -> bool:
        kv = self.kvs[b]
        return kv.cache is self._caches[b] and all(
            layer._k is view for layer, view in zip(kv.cache.layers, self._views[b]))

    def matches(self, kvs: list[KVState], width: int) -> bool:
        """True when `kvs` are exactly the members, all attached, with room for `width` more."""
        if len(kvs) != len(self.kvs) or any(id(kv) not in self.rows for kv in kvs):
            return False
        return all(self.attached(b) and len(kv) + width <= self.capacity
                   for b, kv in enumerate(self.kvs))

    def release(self, keep: list[KVState]) -> None:
        """Give members that are not in `keep` their own buffers (copies of their rows)."""
        kept = {id(kv) for kv in keep}
        for b, kv in enumerate(self.kvs):
            if id(kv) not in kept and self.attached(b):
                for layer in kv.cache.layers:
                    layer._k, layer._v = layer._k.clone(), layer._v.clone()

    def lengths(self) -> torch.Tensor:
        """(B,) cached tokens of each row."""
        return torch.tensor([len(kv) for kv in self.kvs])

    def positions(self, width: int) -> torch.Tensor:
        """(3, B, width) positions of `width` new tokens per row, each row's `next_pos` on."""
        pos = torch.tensor([kv.next_pos for kv in self.kvs]).view(-1, 1) + torch.arange(width)
        return pos.unsqueeze(0).repeat(3, 1, 1)

    @staticmethod
    def mask(lengths: torch.Tensor, width: int) -> torch.Tensor:
        """(B, 1, width, longest + width): key j is visible to new token i of row b when
        j < lengths[b] + i + 1 (the row's own cache, then its new tokens causally)."""
        steps = torch.arange(width)
        visible = lengths.view(-1, 1, 1, 1) + steps.view(1, 1, -1, 1) + 1
        return torch.arange(int(lengths.max()) + width).view(1, 1, 1, -1) < visible

    def prepare(self, lengths: torch.Tensor, width: int) -> None:
        """Set this step's write positions: row b writes at lengths[b] + [0, width)."""
        index = (lengths.view(-1, 1) + torch.arange(width)).to(self.cache.layers[0].device)
        longest = int(lengths.max())
        for layer in self.cache.layers:
            layer.prepare(index, longest, width)

    def advance(self, b: int, num_tokens: int) -> None:
        """Row b keeps `num_tokens` of the tokens this step wrote."""
        self.kvs[b].advance(num_tokens)
