"""The static decode step: the text decoder's decode forward written against the model's own
weights, with a fraction of the host ops transformers' modules dispatch.

A decode step feeds a few text tokens (the last sampled token, plus drafts) per sequence. For
that, transformers' forward dispatches about 75 aten ops per decoder layer (module calls, dtype
round trips, rotate_half, mask building); this step does about 26 with the same arithmetic:
RMSNorm by `F.rms_norm`, rotary embedding as one matmul with a per-position rotation matrix
built once per step, K/V written in place into the sequence's cache buffers (`kv.GrowableLayer`
of one sequence, the rows of a `kv.PackedBatch` for several), attention by SDPA over exactly
the filled part (no mask for one sequence and one token; a boolean mask only for several
sequences or several tokens), each residual add inside its projection's `addmm` (no bias).
Forward hooks of the decoder layers still see every layer's
output (DFlash reads hidden states through them). Logits equal transformers' to float rounding;
the tests hold the decoded tokens equal to the eager path's. A step reads nothing back from the
device: its host integers go over in one copy and positions, write index and mask are built
from them there (tests/unit/reasoner/test_decode_host_syncs.py).

`compile_step` wraps the per-layer function in `torch.compile` (one graph for every layer:
weights are arguments). Shapes then have to stay fixed, so attention runs over each buffer's
whole capacity with a mask. Off by default; on CUDA `mode="reduce-overhead"` asks for CUDA
graphs, which it will not get: the layer mutates the K/V buffers it is passed, and cudagraph
trees refuse mutated non-static inputs. `graphs` (graphs.py) captures the whole step instead:
`forward` is the part a graph records (tensors in, no host reads). Not run on a GPU.

A projection that is not a plain `nn.Linear` (the FP8 reasoner's W8A8 `Fp8Linear`, whose
`weight` is a float8 buffer, or any quantised linear) is called as a module instead of read as
a weight: its own forward does the arithmetic. The compiled step takes plain linears only (a
module argument would guard and recompile per layer); with any other projection it stands
aside and transformers' forward decodes.

Architectures: decoder layers with q/k/v/o projections (biases optional), optional per-head
q/k RMSNorm, a gated (gate/up/down) or two-projection (fc1/fc2) MLP, full attention only —
Qwen2.5-VL, Qwen3-VL, Cosmos3 Omni and Edge. Anything else keeps transformers' forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from worldserve.models.qwen_vl.graphs import StepGraphs
from worldserve.models.qwen_vl.kv import GrowableLayer, KVState, PackedBatch


class StepHost(Protocol):
    """What a static step needs of its runner: the model's device and the forward count."""

    device: torch.device
    num_forwards: int

MAX_WIDTH = 16  # tokens per sequence a static step feeds (a decode token and its drafts)


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's tensors (the model's own parameters, not copies)."""

    module: Any  # the decoder layer (its forward hooks see the step's hidden states)
    norms: tuple[Any, ...]  # (input, post-attention, q or None, k or None): (weight, eps)
    qkvo: tuple[Any, ...]  # weights and biases of q, k, v, o
    mlp: tuple[Any, ...]  # gated: (gate, up, down); plain: (fc1 w, fc1 b, fc2 w, fc2 b)
    act: Any
    gated: bool
    out_t: tuple[Any, Any]  # o_proj and down/fc2 weights transposed (views, made once)


@dataclass(frozen=True)
class Shapes:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scaling: float


class StaticDecoder:
    """Decode steps of one model (see the module doc); `build` says whether it applies."""

    def __init__(self, model: Any, layers: list[LayerWeights], shapes: Shapes,
                 compile_step: bool, graphs: StepGraphs | None = None) -> None:
        self.text = model.model.language_model
        self.lm_head = model.get_output_embeddings()
        self.layers = layers
        self.shapes = shapes
        self.graphs = graphs  # captured steps (graphs.py), when configured
        # static shapes (compiled or captured): attend over whole buffers, masked
        self.full_buffers = compile_step or graphs is not None
        self.layer_fn = _compiled(_layer) if compile_step else _layer
        d = shapes.head_dim
        half = torch.arange(d // 2)
        rotate = torch.zeros(d, d)  # x @ rotate == rotate_half(x) == cat(-x2, x1)
        rotate[half + d // 2, half] = -1.0
        rotate[half, half + d // 2] = 1.0
        self.rotate = rotate

    @classmethod
    def build(cls, model: Any, compile_step: bool = False,
              graphs: StepGraphs | None = None) -> StaticDecoder | None:
        """The static decoder of `model`, or None when its text decoder is not one it knows."""
        text = getattr(getattr(model, "model", None), "language_model", None)
        config = getattr(text, "config", None)
        if text is None or any(t != "full_attention"
                               for t in getattr(config, "layer_types", None) or []):
            return None
        try:
            layers = [_weights(layer) for layer in text.layers]
            attn = text.layers[0].self_attn
            shapes = Shapes(config.num_attention_heads, config.num_key_value_heads,
                            attn.head_dim, float(attn.scaling))
        except AttributeError:
            return None
        if compile_step and any(isinstance(t, nn.Module) for layer in layers
                                for t in (*layer.qkvo, *layer.mlp)):
            return None
        return cls(model, layers, shapes, compile_step, graphs)

    def fits(self, kvs: list[KVState], width: int = 1) -> bool:
        """True when every cache is a filled dense one (`GrowableLayer`s) and at most
        MAX_WIDTH tokens are fed per sequence."""
        return width <= MAX_WIDTH and all(
            isinstance(layer, GrowableLayer) and layer._k is not None
            for kv in kvs for layer in kv.cache.layers)

    @torch.inference_mode()
    def step(self, runner: StepHost, kvs: list[KVState], fed: list[list[int]],
             packed: PackedBatch | None = None) -> list[torch.Tensor]:
        """Append `fed[i]` to `kvs[i]`; (len(fed[i]), V) float32 logits per sequence. Several
        sequences must be the members of `packed` (their rows, in any order). Reads nothing
        back from the device; the host's integers go over in one copy (`_upload`)."""
        members = packed.kvs if packed is not None else kvs
        by_row = [fed[kvs.index(kv)] for kv in members] if packed is not None else fed
        width = max(len(f) for f in by_row)
        longest = max(len(kv) for kv in members)
        if packed is None:  # room for the new tokens (a packed batch was sized when packed)
            for layer in members[0].cache.layers:
                _reserve(layer, longest + width)
        host = _host_plan(members, by_row, width, runner.device)
        buffers = self.buffers(members, packed)
        if self.graphs is not None and not self.hooked:
            logits = self.graphs.run(self.forward, buffers, len(members), width, host)
        else:
            plan = host.to(runner.device, non_blocking=True)  # one copy
            logits = self.forward(plan, buffers, len(members), width, longest)
        runner.num_forwards += 1
        for b, kv in enumerate(members):
            kv.advance(len(by_row[b]))  # row b keeps the tokens this step wrote for it
            kv.record_next(by_row[b])
        rows = {id(kv): b for b, kv in enumerate(members)}
        return [logits[rows[id(kv)], : len(f)] for kv, f in zip(kvs, fed)]

    @property
    def hooked(self) -> bool:
        """Whether a decoder layer has forward hooks (DFlash reads hidden states through
        them): Python a replayed graph would not run."""
        return any(weights.module._forward_hooks for weights in self.layers)

    def forward(self, plan: torch.Tensor, buffers: list[torch.Tensor], b: int, width: int,
                longest: int) -> torch.Tensor:
        """The step's device work for `b` sequences: (B, W, V) float32 logits from the uploaded
        integers `plan` (`_host_plan`'s layout), K/V written into `buffers` (`self.buffers`).
        Only tensors in, no host reads, no tensors from Python data: it can be captured as a
        CUDA graph (graphs.py). `longest` sizes the attended length only when buffers are not
        attended whole."""
        tokens = plan[: b * width].view(b, width)
        start, lengths = plan[b * width: b * (width + 1)], plan[b * (width + 1):]
        steps = torch.arange(width, device=plan.device)
        x = self.text.embed_tokens(tokens)  # (B, W, H)
        rotation = self._rotation(x, start.view(-1, 1) + steps)
        views = _Views(self, buffers, lengths, longest, steps)
        x = x.view(b * width, -1)  # (B * W, H)
        for i, weights in enumerate(self.layers):
            k_buf, v_buf = buffers[2 * i], buffers[2 * i + 1]
            out = self.layer_fn(x, weights.norms, weights.qkvo, weights.mlp, weights.act,
                                weights.gated, weights.out_t, self.shapes, width, rotation,
                                k_buf, v_buf, views.index, views.length, views.mask)
            for hook in weights.module._forward_hooks.values():  # as the layer's own output
                hook(weights.module, (x,), out.view(b, width, -1))
            x = out
        return self.lm_head(self.text.norm(x)).float().view(b, width, -1)

    def buffers(self, members: list[KVState], packed: PackedBatch | None) -> list[torch.Tensor]:
        """Every layer's K and V buffer the step writes (a captured step's fixed addresses)."""
        if packed is not None:
            return [t for layer in packed.cache.layers for t in (layer.k_buf, layer.v_buf)]
        return [t for layer in members[0].cache.layers for t in (layer._k, layer._v)]

    def _rotation(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """(B, 1, W, D, D) or, for W = 1, (B, 1, D, D): q @ R == q * cos + rotate_half(q) * sin
        at each token's position (text tokens: the three M-RoPE axes agree)."""
        cos, sin = self.text.rotary_emb(x, positions.unsqueeze(0).expand(3, -1, -1))
        if self.rotate.device != x.device or self.rotate.dtype != x.dtype:
            # once: a copy per step was a host-to-device transfer (a sync on CUDA) every token
            self.rotate = self.rotate.to(device=x.device, dtype=x.dtype)
        rotation = torch.diag_embed(cos) + self.rotate * sin.unsqueeze(-2)  # (B, W, D, D)
        return rotation[:, None, 0] if x.shape[1] == 1 else rotation[:, None]


class _Views:
    """Where one step writes and reads each layer's K/V: the write index, the attended length
    and the mask (None when not needed). Built on the device from the uploaded `lengths` (B,);
    `longest`, the host's own count, sizes them unless whole buffers are attended."""

    def __init__(self, decoder: StaticDecoder, buffers: list[torch.Tensor],
                 lengths: torch.Tensor, longest: int, steps: torch.Tensor) -> None:
        width, batch = steps.shape[0], lengths.shape[0]
        self.capacity = buffers[0].shape[2]
        self.length = self.capacity if decoder.full_buffers else longest + width
        write = lengths.view(-1, 1) + steps  # (B, W)
        shapes = decoder.shapes
        self.index = write.view(batch, 1, width, 1).expand(
            -1, shapes.num_kv_heads, -1, shapes.head_dim)
        self.mask = None
        if batch > 1 or width > 1 or decoder.full_buffers:
            visible = lengths.view(-1, 1, 1, 1) + steps.view(1, 1, -1, 1) + 1
            keys = torch.arange(self.length, device=steps.device)
            self.mask = keys.view(1, 1, 1, -1) < visible


def _host_plan(members: list[KVState], by_row: list[list[int]], width: int,
               device: torch.device) -> torch.Tensor:
    """The step's host integers, one tensor: (B, W) fed tokens (a short row padded with its
    last), then (B,) first positions, then (B,) cached lengths. Pinned when they go to a CUDA
    device: a `non_blocking` copy from pinned memory is queued, from pageable memory it waits
    for the GPU (not run on a GPU)."""
    values = [t for f in by_row for t in f + [f[-1]] * (width - len(f))]
    values += [kv.next_pos for kv in members] + [len(kv) for kv in members]
    host = torch.tensor(values, dtype=torch.long)
    return host.pin_memory() if device.type == "cuda" else host


def _reserve(layer: GrowableLayer, capacity: int) -> None:
    if layer._k.shape[-2] < capacity:
        layer.reserve(layer._k[:, :, :1], layer._v[:, :, :1], 2 * capacity)


def _weights(layer: Any) -> LayerWeights:
    attn, mlp = layer.self_attn, layer.mlp
    norms = tuple(_norm(m) for m in (layer.input_layernorm, layer.post_attention_layernorm,
                                     getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)))
    qkvo = tuple(t for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
                 for t in _operand(proj))
    if hasattr(mlp, "gate_proj"):
        down = _operand(mlp.down_proj)[0]
        return LayerWeights(layer, norms, qkvo, (_operand(mlp.gate_proj)[0],
                                                 _operand(mlp.up_proj)[0], down),
                            mlp.act_fn, True, (_transposed(qkvo[6]), _transposed(down)))
    fc1, fc2 = _operand(mlp.fc1), _operand(mlp.fc2)
    return LayerWeights(layer, norms, qkvo, (*fc1, *fc2), mlp.activation_fn, False,
                        (_transposed(qkvo[6]), _transposed(fc2[0])))


def _operand(proj: Any) -> tuple[Any, Any]:
    """(weight, bias) of a plain `nn.Linear`; (the module, None) of anything else, which the
    step calls instead (an `Fp8Linear`'s float8 weight cannot enter `F.linear`)."""
    if type(proj) is nn.Linear:
        return proj.weight, proj.bias
    if not isinstance(proj, nn.Module):
        raise AttributeError(f"{type(proj).__name__} is not a projection module")
    return proj, None


def _transposed(weight: Any) -> Any:
    return weight if isinstance(weight, nn.Module) else weight.mT


def _linear(h: torch.Tensor, weight: Any, bias: torch.Tensor | None = None) -> torch.Tensor:
    """h @ weight.T (+ bias), or the projection module's own forward."""
    if isinstance(weight, nn.Module):
        return weight(h)
    return F.linear(h, weight, bias)


def _norm(module: Any) -> tuple[Any, float] | None:
    if module is None:
        return None
    eps = getattr(module, "variance_epsilon", None) or getattr(module, "eps")
    return module.weight, float(eps)


def _rms(x: torch.Tensor, norm: tuple[Any, float]) -> torch.Tensor:
    """RMSNorm as the Qwen-family modules compute it: in float32, cast back, then scaled."""
    weight, eps = norm
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return weight * F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)


def _layer(x: torch.Tensor, norms: tuple, qkvo: tuple, mlp: tuple, act: Any, gated: bool,
           out_t: tuple, shapes: Shapes, width: int, rotation: torch.Tensor, k_buf: torch.Tensor,
           v_buf: torch.Tensor, index: torch.Tensor, length: int,
           mask: torch.Tensor | None) -> torch.Tensor:
    """One decoder layer over the new tokens x (B * W, H), `width` W per sequence; writes
    their K/V at `index`. A projection without bias adds its residual in the same op."""
    wq, bq, wk, bk, wv, bv, wo, bo = qkvo
    h = _rms(x, norms[0])
    q = _heads(_linear(h, wq, bq), width, shapes.num_heads, shapes.head_dim)  # (B, nh, W, D)
    k = _heads(_linear(h, wk, bk), width, shapes.num_kv_heads, shapes.head_dim)
    v = _heads(_linear(h, wv, bv), width, shapes.num_kv_heads, shapes.head_dim)
    if norms[2] is not None:
        q, k = _rms(q, norms[2]), _rms(k, norms[3])
    q, k = _rotate(q, rotation), _rotate(k, rotation)
    k_buf.scatter_(2, index, k)
    v_buf.scatter_(2, index, v)
    attn = F.scaled_dot_product_attention(
        q, k_buf[:, :, :length], v_buf[:, :, :length], attn_mask=mask, scale=shapes.scaling,
        enable_gqa=shapes.num_heads != shapes.num_kv_heads)
    attn = attn.view(x.shape[0], -1) if width == 1 else \
        attn.transpose(1, 2).reshape(x.shape[0], -1)
    x = _plus_linear(x, attn, wo, out_t[0], bo)
    h = _rms(x, norms[1])
    if gated:
        return _plus_linear(x, act(_linear(h, mlp[0])) * _linear(h, mlp[1]), mlp[2],
                            out_t[1], None)
    return _plus_linear(x, act(_linear(h, mlp[0], mlp[1])), mlp[2], out_t[1], mlp[3])


def _plus_linear(x: torch.Tensor, a: torch.Tensor, weight: Any, weight_t: Any,
                 bias: torch.Tensor | None) -> torch.Tensor:
    """x + a @ weight.T (+ bias): one addmm when there is no bias (a plain weight)."""
    if bias is None and not isinstance(weight, nn.Module):
        return torch.addmm(x, a, weight_t)
    return x + _linear(a, weight, bias)


def _heads(t: torch.Tensor, width: int, num_heads: int, head_dim: int) -> torch.Tensor:
    """(B * W, nh * D) -> (B, nh, W, D); for W = 1 the same memory, one view."""
    if width == 1:
        return t.view(-1, num_heads, 1, head_dim)
    return t.view(-1, width, num_heads, head_dim).transpose(1, 2)


def _rotate(t: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    if rotation.dim() == 4:  # one token: (B, nh, 1, D) @ (B, 1, D, D)
        return t @ rotation
    return (t.unsqueeze(-2) @ rotation).squeeze(-2)  # (B, nh, W, 1, D) @ (B, 1, W, D, D)


def _compiled(fn: Any) -> Any:
    mode = "reduce-overhead" if torch.cuda.is_available() else None
    return torch.compile(fn, dynamic=False, mode=mode)
