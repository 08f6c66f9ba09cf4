"""Forwards over several sequences at once: batched decode steps and batched prefills.

The caches of the sequences stay packed in one batch buffer across steps (`kv.PackedBatch`);
row b attends to its own [0, length_b) plus its new tokens causally (a boolean mask hides the
rest); shorter query rows are padded at the end (their outputs and K/V are ignored). Positions
are per sequence (`next_pos` onward), so gaps stay intact. Logits stay on the model's device.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from worldserve.models.qwen_vl.decode import StaticDecoder
from worldserve.models.qwen_vl.kv import KVState, PackedBatch, new_cache
from worldserve.models.types import VisionInput


class BatchHost(Protocol):
    """What the batched forwards use of their runner (`runner.QwenVLRunner`)."""

    model: Any
    device: torch.device
    static: StaticDecoder | None
    packed: PackedBatch | None
    last_batch_rows: list[int]
    num_forwards: int
    num_packs: int

    def forward(self, kv: KVState, ids: list[int], media: list[VisionInput] | None = None,
                encoded: dict[str, Any] | None = None, num_logits: int = 1) -> torch.Tensor: ...

    def chunk_positions(self, ids: torch.Tensor, media: list[VisionInput],
                        offset: int) -> torch.Tensor: ...

    def model_kwargs(self, ids: torch.Tensor, media: list[VisionInput],
                     encoded: dict[str, Any] | None) -> dict[str, Any]: ...


@torch.inference_mode()
def forward_decode_batch(runner: BatchHost, kvs: list[KVState],
                         fed: list[list[int]]) -> list[torch.Tensor]:
    """One decode step of several sequences in one forward. `fed[b]` is sequence b's last
    sampled token plus its speculative drafts (if any). Returns (len(fed[b]), V) float32 logits
    per sequence. A single sequence takes the plain forward (no batch, no mask)."""
    if len(kvs) == 1:
        runner.last_batch_rows = [0]
        return [runner.forward(kvs[0], fed[0], num_logits=len(fed[0]))]
    if not PackedBatch.supports(kvs):
        return forward_repacked(runner, kvs, fed)
    packed = packed_for(runner, kvs, max(len(f) for f in fed))
    if runner.static is not None and runner.static.fits(kvs, max(len(f) for f in fed)):
        runner.last_batch_rows = [packed.rows[id(kv)] for kv in kvs]
        return runner.static.step(runner, kvs, fed, packed)
    return _forward_rows(runner, kvs, fed)


@torch.inference_mode()
def forward_prefill_batch(runner: BatchHost, kvs: list[KVState], ids: list[list[int]],
                          media: list[list[VisionInput]]) -> list[torch.Tensor]:
    """Prefill one chunk per sequence (`ids[b]` with the placeholders of `media[b]`) in one
    forward, the vision tower run once for all of them; returns each chunk's last-position
    logits (V,). Each chunk keeps the positions it would get alone."""
    if not PackedBatch.supports(kvs):  # e.g. a session's first frame: nothing to pack yet
        return [runner.forward(kv, chunk, items)[-1] for kv, chunk, items in zip(kvs, ids, media)]
    positions = [runner.chunk_positions(torch.tensor([chunk]), items, kv.next_pos)[:, 0]
                 for kv, chunk, items in zip(kvs, ids, media)]
    rows = _forward_rows(runner, kvs, ids, positions, media, last_only=True)
    return [row[-1] for row in rows]


def _forward_rows(runner: BatchHost, kvs: list[KVState], fed: list[list[int]],
                  positions: list[torch.Tensor] | None = None,
                  media: list[list[VisionInput]] | None = None,
                  last_only: bool = False) -> list[torch.Tensor]:
    """Append `fed[i]` to `kvs[i]` for every i in one forward over their packed batch.
    `positions[i]`: (3, len(fed[i])), default `next_pos` onward; `media[i]`: the images and clips
    of `fed[i]`'s placeholders. Returns per sequence the logits of its fed tokens (only the last
    one's when `last_only`)."""
    width = max(len(f) for f in fed)
    packed = packed_for(runner, kvs, width)
    rows = [packed.rows[id(kv)] for kv in kvs]
    runner.last_batch_rows = rows
    num_rows = len(packed.kvs)
    by_row: list[list[int]] = [[] for _ in range(num_rows)]
    media_by_row: list[list[VisionInput]] = [[] for _ in range(num_rows)]
    pos = packed.positions(width)
    for i, b in enumerate(rows):
        by_row[b] = fed[i]
        if positions is not None:
            n = len(fed[i])
            pos[:, b, :n] = positions[i]
            pos[:, b, n:] = positions[i][:, -1:]  # padding: ignored
        if media is not None:
            media_by_row[b] = media[i]
    lengths = packed.lengths()
    tokens = torch.tensor([f + [f[-1]] * (width - len(f)) for f in by_row])
    flat = [m for row_media in media_by_row for m in row_media]  # row-major, as placed
    keep: int | torch.Tensor = width
    if last_only:
        lasts = sorted({len(f) - 1 for f in by_row})
        keep = torch.tensor(lasts)
    packed.prepare(lengths, width)
    out = runner.model(
        input_ids=tokens.to(runner.device), position_ids=pos.to(runner.device),
        attention_mask=packed.mask(lengths, width).to(runner.device), cache=packed.cache,
        use_cache=True, logits_to_keep=keep, **runner.model_kwargs(tokens, flat, None),
    )
    runner.num_forwards += 1
    logits = out.logits.float()
    for b, kv in enumerate(packed.kvs):
        n = len(by_row[b])
        packed.advance(b, n)
        kv.record(by_row[b], pos[:, b, :n])
    if last_only:
        return [logits[b, lasts.index(len(f) - 1)].unsqueeze(0) for b, f in zip(rows, fed)]
    return [logits[b, : len(f)] for b, f in zip(rows, fed)]


def packed_for(runner: BatchHost, kvs: list[KVState], width: int) -> PackedBatch:
    """The resident packed batch of `kvs`, packed anew when the batch changed."""
    packed = runner.packed
    if packed is not None and packed.matches(kvs, width):
        return packed
    if packed is not None:
        packed.release(keep=kvs)
    runner.packed = packed = None  # drop the old buffers before allocating the new ones
    runner.packed = PackedBatch(runner.model.config, kvs, width)
    runner.num_packs += 1
    return runner.packed


@torch.inference_mode()
def forward_repacked(runner: BatchHost, kvs: list[KVState],
                     fed: list[list[int]]) -> list[torch.Tensor]:
    """`forward_decode_batch` for caches that cannot stay packed (layers other than
    `GrowableLayer`): the caches are left-padded into a new batch every step with a boolean
    attention mask (padding masked out); shorter query rows are padded at the end (their
    outputs are ignored). Each sequence's new K/V is appended back to its own cache.
    """
    runner.last_batch_rows = list(range(len(kvs)))
    lengths = [len(kv) for kv in kvs]
    longest, width = max(lengths), max(len(f) for f in fed)
    cache = _left_padded(runner, kvs, lengths, longest + width)
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    mask = torch.zeros(len(kvs), 1, width, longest + width, dtype=torch.bool)
    for b, length in enumerate(lengths):
        mask[b, 0, :, longest - length:longest] = True
        mask[b, 0, :, longest:] = causal
    steps = torch.arange(width)
    positions = torch.stack([kv.next_pos + steps for kv in kvs]).unsqueeze(0).expand(3, -1, -1)
    tokens = torch.tensor([f + [f[-1]] * (width - len(f)) for f in fed])
    out = runner.model(
        input_ids=tokens.to(runner.device), position_ids=positions.to(runner.device),
        attention_mask=mask.to(runner.device), cache=cache, use_cache=True, logits_to_keep=width,
    )
    runner.num_forwards += 1
    logits = out.logits.float()
    for b, kv in enumerate(kvs):
        n = len(fed[b])
        for layer_idx, new in enumerate(cache.layers):
            kv.cache.layers[layer_idx].update(new.keys[b:b + 1, :, longest:longest + n],
                                              new.values[b:b + 1, :, longest:longest + n])
        kv.record(fed[b], positions[:, b, :n])
    return [logits[b, : len(fed[b])] for b in range(len(kvs))]


def _left_padded(runner: BatchHost, kvs: list[KVState], lengths: list[int],
                 size: int) -> Any:
    """A new cache holding every sequence's K/V right-aligned at `max(lengths)`, `size` long."""
    longest = max(lengths)
    batch = new_cache(runner.model.config)
    for layer_idx, layer in enumerate(batch.layers):
        first = kvs[0].cache.layers[layer_idx]
        k_shape = (len(kvs), first.keys.shape[1], size, first.keys.shape[-1])
        v_shape = (len(kvs), first.values.shape[1], size, first.values.shape[-1])
        # zeros, not empty: padded slots are masked, but 0 x NaN would still poison the output
        keys, values = first.keys.new_zeros(k_shape), first.values.new_zeros(v_shape)
        for b, (kv, length) in enumerate(zip(kvs, lengths)):
            src = kv.cache.layers[layer_idx]
            keys[b, :, longest - length:longest] = src.keys[0]
            values[b, :, longest - length:longest] = src.values[0]
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
        layer.length = longest  # the fed tokens are written into the spare slots
    return batch
