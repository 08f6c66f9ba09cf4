"""Independent references for the session engine's KV cache.

`MaskedReference` keeps every token ever fed and, instead of deleting evicted tokens from the
cache, masks them out of attention. That is mathematically what eviction from a dense cache
does (tokens computed after an evicted segment keep the K/V they computed with it present), so
the engine's cache and replies must match it; positions are recomputed here from the model's own
`get_rope_index`, independently of the engine.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache


def _positions(model: Any, ids: torch.Tensor, images: list[Any], offset: int) -> torch.Tensor:
    if not images:
        return torch.arange(ids.shape[1]).view(1, 1, -1).expand(3, 1, -1) + offset
    mm = (ids == model.config.image_token_id).long()
    grid = torch.cat([im.payload.grid_thw for im in images])
    pos, _ = model.model.get_rope_index(ids, mm_token_type_ids=mm, image_grid_thw=grid)
    return pos + offset


@torch.inference_mode()
def forward(model: Any, cache: DynamicCache, ids: list[int], images: list[Any], offset: int,
            mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain forward of `ids` on `cache`; returns (logits (T, V), positions (3, T))."""
    input_ids = torch.tensor([ids])
    pos = _positions(model, input_ids, images, offset)
    kwargs: dict[str, Any] = {}
    if images:
        kwargs["pixel_values"] = torch.cat([im.payload.pixel_values for im in images])
        kwargs["image_grid_thw"] = torch.cat([im.payload.grid_thw for im in images])
        kwargs["mm_token_type_ids"] = (input_ids == model.config.image_token_id).long()
    if mask is not None:
        kwargs["attention_mask"] = mask
    out = model(input_ids=input_ids, position_ids=pos, cache=cache, use_cache=True, **kwargs)
    return out.logits[0].float(), pos[:, 0]


def reply_tokens(session: Any) -> list[int]:
    """The last reply of `session`: fed tokens (its assistant_text segment) + the last one."""
    return list(session.segments[-1].ids) + [session.pending_token]


class MaskedReference:
    def __init__(self, model: Any) -> None:
        self.model = model
        self.cache = DynamicCache(config=model.config)
        self.keys: list[tuple[int, int, int]] = []  # position triple of every token fed
        self.alive: list[bool] = []
        self.next_pos = 0

    def follow(self, session: Any) -> list[int]:
        """Replay the engine's last frame; asserts positions, cache and reply agree.
        Returns the reply tokens checked."""
        kv = session.kv
        cur = [tuple(p) for p in kv.positions.t().tolist()]
        cur_set = set(cur)
        for i, key in enumerate(self.keys):  # evicted by the engine -> masked out here
            if key not in cur_set:
                self.alive[i] = False
        known = set(self.keys)
        new = [i for i, key in enumerate(cur) if key not in known]
        assert new == list(range(len(cur) - len(new), len(cur))), "new tokens must be a suffix"
        ids = kv.ids[len(cur) - len(new):]
        video = [s for s in session.segments if s.image is not None][-1]
        total = len(self.keys) + len(ids)
        causal = torch.ones(len(ids), total, dtype=torch.bool).tril(len(self.keys))
        causal[:, : len(self.keys)] &= torch.tensor(self.alive, dtype=torch.bool)
        logits, pos = forward(self.model, self.cache, ids, [video.image], self.next_pos,
                              causal[None, None])
        assert torch.equal(pos, kv.positions[:, -len(ids):]), "chunk positions differ"
        self.keys += [tuple(p) for p in pos.t().tolist()]
        self.alive += [True] * len(ids)
        self.next_pos = int(pos.max()) + 1
        self._check_cache(kv)
        reply = reply_tokens(session)
        start = len(ids) - (len(reply) - 1) - 1
        predicted = logits[start:].argmax(-1).tolist()
        assert predicted == reply, (predicted, reply)
        return reply

    def _check_cache(self, kv: Any) -> None:
        alive = torch.tensor(self.alive, dtype=torch.bool)
        for ref, got in zip(self.cache.layers, kv.cache.layers):
            torch.testing.assert_close(ref.keys[:, :, alive], got.keys, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(ref.values[:, :, alive], got.values, atol=1e-4, rtol=1e-4)


def full_recompute_check(model: Any, session: Any) -> list[int]:
    """After a re-prefill: the cache equals a one-shot forward over the retained tokens at fresh
    positions (the model's own positions over the whole sequence, all retained images)."""
    kv = session.kv
    images = [s.image for s in session.segments if s.image is not None]
    cache = DynamicCache(config=model.config)
    logits, pos = forward(model, cache, list(kv.ids), images, 0)
    assert torch.equal(pos, kv.positions), "re-prefill positions differ from a fresh prompt"
    for ref, got in zip(cache.layers, kv.cache.layers):
        torch.testing.assert_close(ref.keys, got.keys, atol=1e-4, rtol=1e-4)
    reply = reply_tokens(session)
    predicted = logits[len(kv.ids) - len(reply):].argmax(-1).tolist()
    assert predicted == reply, (predicted, reply)
    return reply
