"""A DFlash drafter attached to a reasoner's target model, with per-sequence drafter caches.

DFlash (block diffusion drafting) reads the target's hidden states at `target_layer_ids`: each
token the target has processed becomes a context K/V entry in the drafter's `DFlashCache`; a
draft is one drafter forward over `[anchor, mask x (block_size - 1)]` whose outputs go through
the target's `lm_head`. transformers' `DFlashTokenCandidateGenerator` does that step inside
`generate()`; here one generator per sequence is driven directly, so that its cache can follow
the session's cache: `DrafterState` holds the context of exactly the target's cached tokens and
evicts, truncates and resets with it.

The target's hidden states come from forward hooks on its decoder layers (`HiddenTap`), so the
runner's forwards (single and batched) need no change.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from transformers import GenerationConfig
from transformers.cache_utils import DynamicSlidingWindowLayer
from transformers.generation.candidate_generator import DFlashTokenCandidateGenerator

from worldserve.models.detect import describe, read_json
from worldserve.models.dflash.layouts import layout_of, read_drafter
from worldserve.models.types import ModelLoadError

_NO_LENGTH_LIMIT = 1 << 40  # the session engine enforces lengths itself


def load_drafter(drafter_dir: Path, target: Any, *, dtype: str = "float32",
                 device: str = "cpu") -> DFlashDrafter:
    """Load the drafter in `drafter_dir` and attach it to `target` (the reasoner's model).
    ModelLoadError says what was found when the directory is no DFlash drafter or does not fit
    the target."""
    drafter_dir = Path(drafter_dir).expanduser()
    if not drafter_dir.is_dir():
        raise ModelLoadError(f"streaming.spec_model_path {str(drafter_dir)!r} is not a "
                             "directory (a DFlash drafter checkpoint folder)")
    if layout_of(read_json(drafter_dir / "config.json") or {}) is None:
        raise ModelLoadError(
            f"streaming.spec_model_path {drafter_dir} is not a DFlash drafter directory: found "
            f"{describe(drafter_dir)}; expected config.json of a DFlash drafter (model_type "
            f"muse_glimmer_assistant, z-lab's DFlashDraftModel or speculators_model_type dflash)")
    try:
        model = read_drafter(drafter_dir, dtype)
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"cannot load the DFlash drafter from {drafter_dir}: {exc}") from exc
    check_fits(model.config, target, drafter_dir)
    return DFlashDrafter(model.to(device).eval(), target)


def check_fits(config: Any, target: Any, drafter_dir: Path) -> None:
    """The drafter reads the target's hidden states and embeddings: sizes must agree."""
    text = getattr(target.config, "text_config", target.config)
    layers = int(text.num_hidden_layers)
    problems = []
    if config.hidden_size != text.hidden_size:
        problems.append(f"hidden_size {config.hidden_size} != the target's {text.hidden_size}")
    bad = [i for i in config.target_layer_ids if not 0 <= i < layers]
    if bad:
        problems.append(f"target_layer_ids {bad} outside the target's {layers} layers")
    if not 0 <= config.mask_token_id < text.vocab_size:
        problems.append(f"mask_token_id {config.mask_token_id} outside the target's vocabulary "
                        f"({text.vocab_size})")
    if config.block_size < 2:
        problems.append(f"block_size {config.block_size} < 2 drafts nothing")
    if problems:
        raise ModelLoadError(f"the DFlash drafter in {drafter_dir} does not fit the reasoner "
                             f"model: {'; '.join(problems)}")


class HiddenTap:
    """Forward hooks on the target's decoder layers: while `capture()` is open, the output
    hidden states (batch, tokens, hidden) of each tapped layer are kept, per forward."""

    def __init__(self, target: Any, layer_ids: list[int]) -> None:
        layers = target.get_decoder().layers
        self.layer_ids = list(layer_ids)
        self._seen: dict[int, torch.Tensor] | None = None
        self._handles = [layers[i].register_forward_hook(self._hook(i)) for i in self.layer_ids]

    def remove(self) -> None:
        """Take the hooks off the target's layers."""
        for handle in self._handles:
            handle.remove()

    def _hook(self, layer_id: int) -> Any:
        def record(_module: Any, _args: Any, output: Any) -> None:
            if self._seen is not None:
                self._seen[layer_id] = output[0] if isinstance(output, tuple) else output
        return record

    @contextmanager
    def capture(self) -> Iterator[dict[int, torch.Tensor]]:
        self._seen = {}
        try:
            yield self._seen
        finally:
            self._seen = None


class DFlashDrafter:
    """The drafter model plus what it borrows from the target (embeddings, lm_head, taps)."""

    def __init__(self, model: Any, target: Any) -> None:
        self.model = model
        self.config = model.config
        self.block_size = int(model.config.block_size)
        self.device = target.get_input_embeddings().weight.device
        self.target = target
        self.tap = HiddenTap(target, model.config.target_layer_ids)

    def new_state(self) -> DrafterState:
        return DrafterState(self)

    def new_generator(self) -> DFlashTokenCandidateGenerator:
        return DFlashTokenCandidateGenerator(
            self.model, self.target.get_input_embeddings(), self.target.get_output_embeddings(),
            GenerationConfig(max_length=_NO_LENGTH_LIMIT, do_sample=False))


class DrafterState:
    """The drafter cache of one sequence, token for token beside the target's cache.

    Context entries [0, num_cached) are in the generator's `DFlashCache`; the newer ones wait in
    `pending` (hidden states per tapped layer and their positions) until the next draft feeds
    them. So `len(self) == len(target cache)` at every point, and an eviction, truncation or
    reset of the target cache is applied here with the same token indices.
    """

    def __init__(self, drafter: DFlashDrafter) -> None:
        self.drafter = drafter
        self.generator = drafter.new_generator()
        self.num_cached = 0
        self.pending: dict[int, torch.Tensor] = {}
        self.pending_pos = torch.zeros(0, dtype=torch.long)

    def __len__(self) -> int:
        return self.num_cached + len(self.pending_pos)

    def extend(self, hidden: dict[int, torch.Tensor], positions: torch.Tensor) -> None:
        """Context of tokens the target just appended: (1, T, H) per tapped layer, (T,)."""
        for i in self.drafter.tap.layer_ids:
            old = self.pending.get(i)
            self.pending[i] = hidden[i] if old is None else torch.cat([old, hidden[i]], dim=1)
        self.pending_pos = torch.cat([self.pending_pos, positions.cpu()])

    @torch.inference_mode()
    def draft(self, anchor: int, limit: int) -> list[int]:
        """Up to min(limit, block_size - 1) drafts following `anchor` (the last sampled token,
        placed right after the last context position)."""
        n = len(self.pending_pos)
        if limit <= 0 or n == 0:
            return []
        # on the target's device: the block's embeddings are looked up in its table
        ids = torch.zeros(1, n + 1, dtype=torch.long, device=self.drafter.device)
        ids[0, -1] = anchor
        positions = torch.cat([self.pending_pos, self.pending_pos[-1:] + 1]).unsqueeze(0)
        outputs = SimpleNamespace(hidden_states={i + 1: h for i, h in self.pending.items()})
        gen = self.generator
        gen.is_main_model_prefill = True  # this call feeds all `n` pending tokens
        candidates, _ = gen.get_candidates(ids, {"position_ids": positions,
                                                 "attention_mask": None},
                                           outputs, is_first_iteration=False, n_last_matches=0)
        gen.cache.crop(-self.drafter.block_size)  # drop the block's own K/V at once
        self.num_cached += n
        self.pending, self.pending_pos = {}, self.pending_pos[:0]
        return candidates[0, n + 1:n + 1 + limit].tolist()

    @torch.inference_mode()
    def evict(self, start: int, end: int) -> None:
        """Drop context tokens [start, end) (the target evicted the same range)."""
        c = self.num_cached
        if start < c:
            for layer in self.generator.cache.layers:
                _evict_layer(layer, start, min(end, c), c)
            self.num_cached -= min(end, c) - start
        lo, hi = max(start, c) - c, max(end, c) - c
        if hi > lo:
            keep = torch.ones(len(self.pending_pos), dtype=torch.bool)
            keep[lo:hi] = False
            self.pending = {i: h[:, keep.to(h.device)] for i, h in self.pending.items()}
            self.pending_pos = self.pending_pos[keep]

    def truncate(self, length: int) -> None:
        """Keep the first `length` context tokens (rejected drafts are still pending: cheap)."""
        if length >= len(self):
            return
        if length < self.num_cached:  # not reached by verification; keep it correct anyway
            self.evict(length, len(self))
            return
        keep = length - self.num_cached
        self.pending = {i: h[:, :keep] for i, h in self.pending.items()}
        self.pending_pos = self.pending_pos[:keep]

    def reset(self) -> None:
        """Empty (a re-prefill then rebuilds the context from its own hidden states)."""
        self.generator = self.drafter.new_generator()
        self.num_cached = 0
        self.pending, self.pending_pos = {}, self.pending_pos[:0]


def _evict_layer(layer: Any, start: int, end: int, length: int) -> None:
    """Drop tokens [start, end) of a drafter cache layer holding `length` context tokens.
    A sliding-window layer keeps only its last tokens: the part of the range inside its window
    goes (the window is not refilled with older tokens: they are no longer stored)."""
    if not getattr(layer, "is_initialized", False) or layer.keys is None:
        return
    stored = layer.keys.shape[-2]
    first = length - stored  # a sliding-window layer keeps only its last `stored` tokens
    lo, hi = max(start - first, 0), max(end - first, 0)
    if hi > lo:
        layer.keys = torch.cat([layer.keys[:, :, :lo], layer.keys[:, :, hi:]], dim=2)
        layer.values = torch.cat([layer.values[:, :, :lo], layer.values[:, :, hi:]], dim=2)
    if isinstance(layer, DynamicSlidingWindowLayer):
        # The attention mask expects min(length, window - 1) stored tokens. Tokens evicted from
        # inside the window are not replaced by older ones (those are gone): the layer then
        # counts only what it holds.
        kept = layer.keys.shape[-2]
        length -= end - start
        layer.cumulative_length = kept if kept < layer.sliding_window - 1 else max(length, kept)
