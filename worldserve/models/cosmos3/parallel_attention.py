"""Sequence parallelism for the Cosmos3 transformer, on the context-parallel seams diffusers
left in it (`Cosmos3OmniTransformer._cp_shard_fn` / `_cp_gather_fn`) plus an attention
processor.

The packed sequence is [understanding (text, causal) | generation (vision, sound, action)].
The understanding part is short (~200 tokens against ~44,000 vision tokens at 720p), so
every rank keeps all of it and runs its causal attention and MLP itself; only the generation
part is split into `ulysses * ring` chunks (padded to equal size; the padding rows are never
used as keys and are dropped at the gather). In each attention layer:

- Ulysses: an all-to-all turns (my chunk, all heads) into (the ring chunk, my head group);
  key/value heads are repeated first when the Ulysses degree does not divide them (GQA);
- the generation queries attend to [understanding keys | generation keys] of their heads:
  with ring = 1 that is one attention call over the whole sequence (the same call as on one
  device, on a subset of heads), with ring > 1 the ring chunks' keys come round one neighbour
  exchange at a time and the partial results merge by log-sum-exp;
- an all-to-all turns the result back into (my chunk, all heads) for the output projection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from worldserve.levers.parallel.attention import (
    gather_heads,
    head_slice,
    repeat_kv,
    ring_attention,
    scatter_heads_many,
)
from worldserve.levers.parallel.comm import all_gather_cat
from worldserve.levers.parallel.mesh import RankMesh

Rotary = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass
class SequenceSplit:
    """The generation part of the forward being run: its true length and chunk size."""

    gen_len: int = 0
    chunk: int = 0


class Cosmos3SequenceParallel:
    """The shard / gather seams and the attention processor, sharing one `SequenceSplit`."""

    def __init__(self, mesh: RankMesh) -> None:
        self.mesh = mesh
        self.split = SequenceSplit()

    def install(self, transformer: Any) -> None:
        transformer._cp_shard_fn = self.shard
        transformer._cp_gather_fn = self.gather
        for layer in transformer.layers:
            layer.self_attn.set_processor(Cosmos3ParallelAttnProcessor(self))

    def shard(self, und_seq: torch.Tensor, gen_seq: torch.Tensor,
              rotary_emb: Rotary) -> tuple[torch.Tensor, torch.Tensor, Rotary]:
        sp = self.mesh.sp
        gen_len = gen_seq.shape[0]
        chunk = math.ceil(gen_len / sp.size)
        self.split = SequenceSplit(gen_len=gen_len, chunk=chunk)
        cos_und, sin_und, cos_gen, sin_gen = rotary_emb
        first = sp.index * chunk
        return und_seq, _chunk(gen_seq, first, chunk), (
            cos_und, sin_und, _chunk(cos_gen, first, chunk), _chunk(sin_gen, first, chunk))

    def gather(self, und_out: torch.Tensor,
               gen_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return und_out, all_gather_cat(gen_out, self.mesh.sp)[: self.split.gen_len]

    def ring_chunk_lengths(self) -> list[int]:
        """Real (unpadded) generation tokens in each ring position's chunk."""
        span = self.split.chunk * self.mesh.ulysses.size
        return [max(0, min(span, self.split.gen_len - r * span))
                for r in range(self.mesh.ring.size)]


def _chunk(x: torch.Tensor, first: int, size: int) -> torch.Tensor:
    """Rows [first, first + size) of x, zero-padded past its end."""
    part = x[first:first + size]
    if part.shape[0] == size:
        return part
    pad = x.new_zeros((size - part.shape[0], *x.shape[1:]))
    return torch.cat((part, pad))


class Cosmos3ParallelAttnProcessor:
    """`Cosmos3AttnProcessor` with the generation queries on a chunk of the sequence."""

    _attention_backend = None
    _parallel_config = None

    def __init__(self, sequence: Cosmos3SequenceParallel) -> None:
        self.sequence = sequence

    def __call__(self, attn: Any, und_seq: torch.Tensor, gen_seq: torch.Tensor,
                 rotary_emb: Rotary) -> tuple[torch.Tensor, torch.Tensor]:
        from diffusers.models.attention_dispatch import dispatch_attention_fn

        q_und, k_und, v_und, k_und_for_gen = _project_und(attn, und_seq, rotary_emb)
        q_gen, k_gen, v_gen = _project_gen(attn, gen_seq, rotary_emb)
        causal_out = dispatch_attention_fn(
            q_und.unsqueeze(0), k_und.unsqueeze(0), v_und.unsqueeze(0), is_causal=True,
            enable_gqa=True, backend=self._attention_backend,
            parallel_config=self._parallel_config).squeeze(0).flatten(-2, -1)
        full_out = self._gen_attention(q_gen, k_gen, v_gen, k_und_for_gen, v_und)
        return attn.to_out(causal_out), attn.to_add_out(full_out.flatten(-2, -1))

    def _gen_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       k_und: torch.Tensor, v_und: torch.Tensor) -> torch.Tensor:
        """(chunk, Hq, D) queries of this rank -> their attention output, same shape."""
        mesh = self.sequence.mesh
        ulysses = mesh.ulysses
        num_heads = q.shape[1]
        if k.shape[1] % ulysses.size:  # GQA heads the Ulysses degree cannot divide
            k, v = repeat_kv(k, num_heads), repeat_kv(v, num_heads)
            k_und, v_und = repeat_kv(k_und, num_heads), repeat_kv(v_und, num_heads)
        q, k, v = scatter_heads_many([q, k, v], ulysses)  # (ring chunk, my heads, D)
        k_und, v_und = head_slice(k_und, ulysses), head_slice(v_und, ulysses)
        lengths = self.sequence.ring_chunk_lengths()
        if mesh.ring.size == 1:
            out = _full_attention(q, torch.cat((k_und, k[: lengths[0]])),
                                  torch.cat((v_und, v[: lengths[0]])), lengths[0], self)
        else:
            out = ring_attention(q, k, v, mesh.ring, lengths, prefix=(k_und, v_und))
        return gather_heads(out, ulysses)


def _full_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_queries: int,
                    proc: Cosmos3ParallelAttnProcessor) -> torch.Tensor:
    """The one-device call on the real query rows; padding rows come back as zeros."""
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    out = dispatch_attention_fn(
        q[:num_queries].unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), is_causal=False,
        enable_gqa=True, backend=proc._attention_backend,
        parallel_config=proc._parallel_config).squeeze(0)
    if num_queries == q.shape[0]:
        return out
    return torch.cat((out, out.new_zeros((q.shape[0] - num_queries, *out.shape[1:]))))


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    from diffusers.models.transformers.transformer_cosmos3 import _rotate_half

    return x * cos + _rotate_half(x) * sin


def _project_und(attn: Any, und_seq: torch.Tensor,
                 rotary_emb: Rotary) -> tuple[torch.Tensor, ...]:
    """Understanding q, k, v (+ k for the generation queries), normed and rotated, exactly as
    `Cosmos3AttnProcessor` does."""
    q = attn.norm_q(attn.to_q(und_seq).view(-1, attn.num_attention_heads, attn.head_dim))
    k = attn.norm_k(attn.to_k(und_seq).view(-1, attn.num_key_value_heads, attn.head_dim))
    v = attn.to_v(und_seq).view(-1, attn.num_key_value_heads, attn.head_dim)
    k_for_gen = attn.k_norm_und_for_gen(k) if attn.k_norm_und_for_gen is not None else k
    cos, sin = rotary_emb[0].unsqueeze(1), rotary_emb[1].unsqueeze(1)
    return _rope(q, cos, sin), _rope(k, cos, sin), v, _rope(k_for_gen, cos, sin)


def _project_gen(attn: Any, gen_seq: torch.Tensor,
                 rotary_emb: Rotary) -> tuple[torch.Tensor, ...]:
    q = attn.norm_added_q(attn.add_q_proj(gen_seq).view(-1, attn.num_attention_heads,
                                                        attn.head_dim))
    k = attn.norm_added_k(attn.add_k_proj(gen_seq).view(-1, attn.num_key_value_heads,
                                                        attn.head_dim))
    v = attn.add_v_proj(gen_seq).view(-1, attn.num_key_value_heads, attn.head_dim)
    cos, sin = rotary_emb[2].unsqueeze(1), rotary_emb[3].unsqueeze(1)
    return _rope(q, cos, sin), _rope(k, cos, sin), v
