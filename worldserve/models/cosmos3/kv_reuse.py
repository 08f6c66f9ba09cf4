"""Understanding-path K/V reuse across denoising steps (issue 25 item 5).

The Cosmos3 packed sequence is [understanding (text, causal) | generation (vision, sound,
action)]. In `transformer_cosmos3.py` (diffusers 0.42.1) the understanding stream never reads
the generation stream: its tokens are text embeddings only (`hidden_states[:und_len]`, the
latents are scattered at `vision/sound/action_sequence_indexes >= und_len`), its attention is
causal over understanding keys only, its MLP and norms are its own, and the timestep
embedding touches noisy generation tokens only. The generation queries read the
understanding stream through two tensors per layer: the rotated `k_und_for_gen` and `v_und`.
Those are the same at every step of a row, so the first forward of a row (per prompt: cond and
uncond) records them and later forwards replay them, running the generation stream alone.

Replay skips the understanding stream's whole stack (projections, causal attention, MLP) by
handing the decoder layers an empty understanding sequence through the transformer's
context-parallel seams (`_cp_shard_fn` / `_cp_gather_fn`, called around the decoder stack);
the gather puts back the recorded final understanding output, so the joint hidden state (and
every index into it) is what a full forward produces. The generation-path arithmetic is the
upstream processor's, op for op, so replayed velocities equal recomputed ones bit for bit
(tests/unit/models/test_cosmos3_speed.py).

Not used (the runner records nothing) with sequence parallelism (it owns the seams and the
processor), under the FP8 mixed-precision
step schedule (it may switch understanding linears between steps), or while a diffusers step
cache is enabled on the transformer (its block hooks keep full-length outputs per stream).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_cosmos3 import Cosmos3AttnProcessor, _rotate_half

Rotary = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass
class UnderstandingKV:
    """One prompt's recorded understanding stream (a row holds one for cond, one for uncond).

    `keys[i]` / `values[i]`: layer i's rotated `k_und_for_gen` / `v_und`, (und_len, kv_heads,
    head_dim); `und_out`: the normed final understanding output, (und_len, hidden)."""

    und_len: int = -1
    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    und_out: torch.Tensor | None = None

    @property
    def recorded(self) -> bool:
        return self.und_out is not None


class UnderstandingKVReuse:
    """Installed once on a transformer; a forward run inside `use(slot)` records into an empty
    slot and replays a recorded one. Outside `use` the processors run the upstream code.

    Each layer's processor holds its own mode and tensors (set here around the forward).
    With `compile: true` the recording / replaying processor runs outside the compiled graph
    (`torch.compiler.disable`; the norms, MLPs and residuals around it stay compiled): traced,
    its modes, stored tensors and the empty understanding sequence multiplied the guard
    variants until a 3-step dev run reached dynamo's recompile limit (8); with the graph
    break a block settles at 4 variants and new request sizes add none."""

    def __init__(self) -> None:
        self.processors: list[ReusingAttnProcessor] = []
        self.slot: UnderstandingKV | None = None
        self.replaying = False
        self.transformer: Any = None

    def install(self, transformer: Any) -> None:
        if transformer._cp_shard_fn is not None or transformer._cp_gather_fn is not None:
            raise ValueError("understanding K/V reuse: the transformer's context-parallel seams "
                             "are taken (sequence parallelism); it cannot be combined with it")
        self.transformer = transformer  # its seams are set only inside `use` (see there)
        self.processors = []
        for layer in transformer.layers:
            processor = ReusingAttnProcessor()
            processor._attention_backend = getattr(layer.self_attn.processor,
                                                   "_attention_backend", None)
            layer.self_attn.set_processor(processor)
            self.processors.append(processor)

    @contextmanager
    def use(self, slot: UnderstandingKV, und_len: int) -> Iterator[None]:
        """Run one forward against `slot` (recording it when empty). The seams are set for
        this forward only: set for good, they would tell other hooks (SeaCache's) that the
        transformer runs context-parallel."""
        if slot.recorded and slot.und_len != und_len:
            raise ValueError(f"understanding K/V recorded for und_len {slot.und_len}, "
                             f"asked to replay at {und_len}")
        self.slot, self.replaying = slot, slot.recorded
        self.transformer._cp_shard_fn = self.shard
        self.transformer._cp_gather_fn = self.gather
        for index, processor in enumerate(self.processors):
            if self.replaying:
                processor.mode = "replay"
                processor.k_und, processor.v_und = slot.keys[index], slot.values[index]
            else:
                processor.mode = "record"
        try:
            yield
            if not self.replaying:
                slot.keys = [p.k_und for p in self.processors]
                slot.values = [p.v_und for p in self.processors]
                slot.und_len = und_len
        finally:
            self.transformer._cp_shard_fn = self.transformer._cp_gather_fn = None
            for processor in self.processors:
                processor.mode, processor.k_und, processor.v_und = "off", None, None
            self.slot, self.replaying = None, False

    # The seams around the decoder stack.

    def shard(self, und_seq: torch.Tensor, gen_seq: torch.Tensor,
              rotary_emb: Rotary) -> tuple[torch.Tensor, torch.Tensor, Rotary]:
        if not self.replaying:
            return und_seq, gen_seq, rotary_emb
        cos_und, sin_und, cos_gen, sin_gen = rotary_emb
        return und_seq[:0], gen_seq, (cos_und[:0], sin_und[:0], cos_gen, sin_gen)

    def gather(self, und_out: torch.Tensor,
               gen_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        slot = self.slot
        if slot is None:
            return und_out, gen_out
        if self.replaying:
            assert slot.und_out is not None
            return slot.und_out, gen_out
        slot.und_out = und_out
        return und_out, gen_out


class ReusingAttnProcessor(Cosmos3AttnProcessor):
    """`Cosmos3AttnProcessor` that records its layer's understanding K/V ("record"), or
    replays it and runs the generation pathway alone ("replay"); "off": upstream."""

    def __init__(self) -> None:
        self.mode = "off"
        self.k_und: torch.Tensor | None = None
        self.v_und: torch.Tensor | None = None

    def __call__(self, attn: Any, und_seq: torch.Tensor, gen_seq: torch.Tensor,
                 rotary_emb: Rotary) -> tuple[torch.Tensor, torch.Tensor]:
        if self.mode == "off":
            return super().__call__(attn, und_seq, gen_seq, rotary_emb)
        return self._reusing(attn, und_seq, gen_seq, rotary_emb)

    @torch.compiler.disable  # see UnderstandingKVReuse: eager even inside a compiled block
    def _reusing(self, attn: Any, und_seq: torch.Tensor, gen_seq: torch.Tensor,
                 rotary_emb: Rotary) -> tuple[torch.Tensor, torch.Tensor]:
        if self.mode == "replay":
            k_und, v_und = self.k_und, self.v_und
            und_out = und_seq.new_zeros((0, attn.to_out.out_features))
        else:
            und_out, k_und, v_und = self._understanding(attn, und_seq, rotary_emb)
            self.k_und, self.v_und = k_und, v_und
        return und_out, self._generation(attn, gen_seq, rotary_emb, k_und, v_und)
    def _understanding(self, attn: Any, und_seq: torch.Tensor, rotary_emb: Rotary
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The upstream processor's understanding half: (output, rotated k for gen, v)."""
        q_und = attn.to_q(und_seq).view(-1, attn.num_attention_heads, attn.head_dim)
        k_und = attn.to_k(und_seq).view(-1, attn.num_key_value_heads, attn.head_dim)
        v_und = attn.to_v(und_seq).view(-1, attn.num_key_value_heads, attn.head_dim)
        q_und = attn.norm_q(q_und)
        k_und = attn.norm_k(k_und)
        k_und_for_gen = (attn.k_norm_und_for_gen(k_und) if attn.k_norm_und_for_gen is not None
                         else k_und)
        cos_und, sin_und = rotary_emb[0].unsqueeze(1), rotary_emb[1].unsqueeze(1)
        q_und = q_und * cos_und + _rotate_half(q_und) * sin_und
        k_und = k_und * cos_und + _rotate_half(k_und) * sin_und
        k_und_for_gen = k_und_for_gen * cos_und + _rotate_half(k_und_for_gen) * sin_und
        causal_out = dispatch_attention_fn(
            q_und.unsqueeze(0), k_und.unsqueeze(0), v_und.unsqueeze(0), is_causal=True,
            enable_gqa=True, backend=self._attention_backend,
            parallel_config=self._parallel_config)
        return attn.to_out(causal_out.squeeze(0).flatten(-2, -1)), k_und_for_gen, v_und

    def _generation(self, attn: Any, gen_seq: torch.Tensor, rotary_emb: Rotary,
                    k_und_for_gen: torch.Tensor, v_und: torch.Tensor) -> torch.Tensor:
        """The upstream processor's generation half, against the given understanding K/V."""
        q_gen = attn.add_q_proj(gen_seq).view(-1, attn.num_attention_heads, attn.head_dim)
        k_gen = attn.add_k_proj(gen_seq).view(-1, attn.num_key_value_heads, attn.head_dim)
        v_gen = attn.add_v_proj(gen_seq).view(-1, attn.num_key_value_heads, attn.head_dim)
        q_gen = attn.norm_added_q(q_gen)
        k_gen = attn.norm_added_k(k_gen)
        cos_gen, sin_gen = rotary_emb[2].unsqueeze(1), rotary_emb[3].unsqueeze(1)
        q_gen = q_gen * cos_gen + _rotate_half(q_gen) * sin_gen
        k_gen = k_gen * cos_gen + _rotate_half(k_gen) * sin_gen
        all_k = torch.cat([k_und_for_gen, k_gen], dim=0)
        all_v = torch.cat([v_und, v_gen], dim=0)
        full_out = dispatch_attention_fn(
            q_gen.unsqueeze(0), all_k.unsqueeze(0), all_v.unsqueeze(0), is_causal=False,
            enable_gqa=True, backend=self._attention_backend,
            parallel_config=self._parallel_config)
        return attn.to_add_out(full_out.squeeze(0).flatten(-2, -1))

