"""The ring hop's CUDA side without a GPU: which kernel it runs at each boundary, the shapes
both kernels hand the merge (fake CUDA tensors: torch's meta kernels carry the layouts), and
that the next hop's exchange is under way while a hop computes (issue 31 item 11)."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from worldserve.levers.parallel import attention
from worldserve.levers.parallel.attention import attention_lse, ring_attention, ring_kernel


def test_the_ring_kernel_at_each_boundary() -> None:
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    assert ring_kernel(bf16, 128, (9, 0)) == "flash"
    assert ring_kernel(fp16, 128, (8, 0)) == "flash"  # Ampere itself
    assert ring_kernel(bf16, 128, (7, 5)) == "efficient"  # Turing: no FlashAttention-2
    assert ring_kernel(fp32, 128, (9, 0)) == "efficient"  # flash takes half precision only
    assert ring_kernel(bf16, 256, (9, 0)) == "flash"
    assert ring_kernel(bf16, 264, (9, 0)) == "efficient"  # past flash's head dim
    assert ring_kernel(bf16, 100, (9, 0)) == "efficient"  # not a multiple of 8


@pytest.mark.parametrize(("dtype", "head_dim", "kernel"), [
    (torch.bfloat16, 128, "flash"), (torch.float32, 128, "efficient"),
    (torch.bfloat16, 100, "efficient")])
def test_both_kernels_hand_the_merge_its_layout(monkeypatch, dtype, head_dim, kernel) -> None:
    """Queries and keys of lengths that are not multiples of 32 (mem-efficient pads its
    log-sum-exp rows), 4 query heads: out (Lq, H, D) in the input dtype, lse (Lq, H) float32."""
    monkeypatch.setattr(attention, "_capability", lambda device: (9, 0))
    called = []
    for name, run in dict(attention.CUDA_KERNELS).items():
        monkeypatch.setitem(attention.CUDA_KERNELS, name,
                            lambda *a, _run=run, _name=name: called.append(_name) or _run(*a))
    with FakeTensorMode(allow_non_fake_inputs=True):
        q = torch.empty(45, 4, head_dim, dtype=dtype, device="cuda")
        k = torch.empty(70, 4, head_dim, dtype=dtype, device="cuda")
        out, lse = attention_lse(q, k, k)
        assert (out.shape, out.dtype, out.device.type) == ((45, 4, head_dim), dtype, "cuda")
        assert (lse.shape, lse.dtype) == ((45, 4), torch.float32)
    assert called == [kernel]


class _Handle:
    size, index, ranks, timeout_s = 3, 1, (0, 1, 2), 5.0


def test_the_next_hop_is_under_way_while_a_hop_computes(monkeypatch) -> None:
    """A 3-ring as rank 1 sees it, the exchange replaced at its boundary: each hop after the
    first starts before the attention that precedes its wait, and the result still equals full
    attention over every chunk (the previous rank's chunk arrives at hop 1, and so on)."""
    torch.manual_seed(0)
    chunks = [(torch.randn(5, 2, 8), torch.randn(5, 2, 8)) for _ in range(3)]
    q = torch.randn(4, 4, 8)
    events: list[str] = []

    class Pending:
        def __init__(self, hop: int) -> None:
            self.hop = hop

        def wait(self) -> torch.Tensor:
            events.append(f"wait {self.hop}")
            k, v = chunks[(_Handle.index - self.hop) % 3]  # the ring's direction
            return torch.stack((k, v))

    started = iter(range(1, 3))

    def start(kv: torch.Tensor, handle: object) -> Pending:
        hop = next(started)
        events.append(f"start {hop}")
        return Pending(hop)

    real_lse = attention.attention_lse

    def computing(*args):
        events.append("attend")
        return real_lse(*args)

    monkeypatch.setattr(attention, "ring_shift_start", start)
    monkeypatch.setattr(attention, "attention_lse", computing)
    k, v = chunks[_Handle.index]
    out = ring_attention(q, k, v, _Handle(), [5, 5, 5])  # type: ignore[arg-type]
    assert events == ["start 1", "attend", "wait 1", "start 2", "attend", "wait 2", "attend"]
    keys = torch.cat([c[0] for c in chunks]).repeat_interleave(2, dim=1)
    values = torch.cat([c[1] for c in chunks]).repeat_interleave(2, dim=1)
    full = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1)).transpose(0, 1)
    assert torch.allclose(out, full, atol=1e-5)
