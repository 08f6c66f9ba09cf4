"""Fit a DFlash drafter to a target's own continuations (dev drafters for tests and benchmarks).

A real drafter is trained on a large corpus; a dev drafter only has to draft what one tiny
random target says, so it is fitted on that target's replies: for every position t of a reply,
the drafter sees what it sees while serving (the target's hidden states at `target_layer_ids`
of every token before t, the anchor token t, then masks) and learns the target's next
`block_size - 1` tokens through the target's own frozen `lm_head`. A few hundred Adam steps on
one batch overfit it: drafts of the fitted replies are then mostly right, which is what tests of
acceptance (and the benchmark's acceptance figures) need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from worldserve.models.dflash.drafter import HiddenTap

IGNORE = -100


@dataclass
class DraftExample:
    context: torch.Tensor  # (T, len(target_layer_ids) * hidden): taps of the tokens before
    positions: torch.Tensor  # (T,) their positions
    anchor: int  # the last sampled token
    labels: list[int]  # the target's next tokens (up to block_size - 1)


def examples(runner: Any, layer_ids: list[int], ids: list[int], media: list[Any],
             first_anchor: int, block_size: int) -> list[DraftExample]:
    """The draft examples of one sequence (`ids` holding `media`): anchors from
    `first_anchor` on, contexts from one forward of the target with its layers tapped."""
    tap = HiddenTap(runner.model, layer_ids)
    kv = runner.new_kv()
    with tap.capture() as seen:
        runner.forward(kv, ids, media)
    tap.remove()
    hidden = torch.cat([seen[i][0] for i in layer_ids], dim=-1).float().clone()  # (N, L*H)
    return examples_of(hidden, kv.positions[0].clone(), ids, first_anchor, block_size)


def examples_of(hidden: torch.Tensor, positions: torch.Tensor, ids: list[int],
                first_anchor: int, block_size: int) -> list[DraftExample]:
    """The draft examples of a sequence whose tapped hidden states (N, L*H) and positions (N,)
    are known: one per anchor from `first_anchor` on."""
    return [DraftExample(hidden[:t], positions[:t], ids[t], ids[t + 1:t + block_size])
            for t in range(max(first_anchor, 1), len(ids) - 1)]


def fit(drafter: Any, target: Any, data: list[DraftExample], steps: int = 150,
        lr: float = 1e-2, seed: int = 0, batch_size: int | None = None) -> float:
    """Train `drafter` (a MuseGlimmerAssistantModel) on `data` in place; returns the last
    loss. The target's embeddings and lm_head stay frozen. Each step sees all of `data`, or
    `batch_size` examples drawn with the seed (a cosine-decayed learning rate then)."""
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    whole = None if batch_size else _batch(drafter.config, target, data)
    head = target.get_output_embeddings().weight.detach().float()
    drafter.float().train()
    optimizer = torch.optim.Adam(drafter.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps) if batch_size else None
    loss = torch.tensor(0.0)
    for _ in range(steps):
        # a drawn batch is padded to its own longest context only
        batch = whole or _batch(drafter.config, target, [
            data[int(i)] for i in torch.randint(len(data), (batch_size,), generator=generator)])
        loss = _loss(drafter, head, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if schedule is not None:
            schedule.step()
    drafter.eval()
    return float(loss.detach())


def _loss(drafter: Any, head: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    logits = F.linear(_draft_hidden(drafter, batch), head)  # (B, block - 1, V)
    return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE)


def _draft_hidden(drafter: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    out = drafter(noise_embeds=batch["noise"], context_hidden_states=batch["context"],
                  attention_mask=batch["mask"], position_ids=batch["positions"])
    return out.last_hidden_state[:, 1:]


@torch.no_grad()
def draft(drafter: Any, target: Any, data: list[DraftExample]) -> torch.Tensor:
    """The drafter's greedy drafts (B, block_size - 1) for each example's anchor, as served:
    the example's context, the anchor, masks, through the target's lm_head."""
    head = target.get_output_embeddings().weight.detach().float()
    return F.linear(_draft_hidden(drafter, _batch(drafter.config, target, data)), head).argmax(-1)


@torch.no_grad()
def acceptance_length(drafter: Any, target: Any, hidden: list[torch.Tensor],
                      positions: list[torch.Tensor], sequences: list[list[int]],
                      first_anchors: list[int]) -> float:
    """Mean tokens per target step (accepted drafts + 1) when greedy decoding with the drafter
    re-makes `sequences` (the target's own greedy continuations from `first_anchors`: the
    first decoded token is each anchor), replayed step by step as verification would."""
    size = int(drafter.config.block_size)
    at = list(first_anchors)
    steps = tokens = 0
    while active := [b for b, seq in enumerate(sequences) if at[b] < len(seq) - 1]:
        batch = [examples_of(hidden[b], positions[b], sequences[b], at[b], size)[0]
                 for b in active]
        for b, ex, drafts in zip(active, batch, draft(drafter, target, batch).tolist()):
            accepted = 0
            while accepted < len(ex.labels) and drafts[accepted] == ex.labels[accepted]:
                accepted += 1
            # the target's own token follows the accepted drafts, unless they end the sequence
            made = min(accepted + 1, len(sequences[b]) - 1 - at[b])
            at[b] += made
            steps, tokens = steps + 1, tokens + made
    return tokens / max(steps, 1)


@torch.no_grad()
def _batch(config: Any, target: Any, data: list[DraftExample]) -> dict[str, torch.Tensor]:
    """Contexts right-padded to one length (padding masked out), blocks after them."""
    size, longest = int(config.block_size), max(len(ex.positions) for ex in data)
    width = data[0].context.shape[-1]
    context = torch.zeros(len(data), longest, width)
    mask = torch.zeros(len(data), longest + size, dtype=torch.long)
    positions = torch.zeros(len(data), longest + size, dtype=torch.long)
    noise_ids = torch.full((len(data), size), int(config.mask_token_id))
    labels = torch.full((len(data), size - 1), IGNORE)
    for b, ex in enumerate(data):
        n = len(ex.positions)
        context[b, :n] = ex.context
        mask[b, :n] = 1
        mask[b, longest:] = 1
        positions[b, :n] = ex.positions
        positions[b, longest:] = ex.positions[-1] + 1 + torch.arange(size)
        noise_ids[b, 0] = ex.anchor
        labels[b, :len(ex.labels)] = torch.tensor(ex.labels, dtype=torch.long)
    noise = target.get_input_embeddings()(noise_ids).float()
    return {"context": context, "mask": mask, "positions": positions, "noise": noise,
            "labels": labels}
