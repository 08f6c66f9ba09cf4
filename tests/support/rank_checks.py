"""Checks of the generic rank-group collectives (levers/parallel), run in each process of a
real gloo group by tests/unit/parallel/test_collectives.py, at 2 ranks and at 3 and 4 (where a
head-order, head-group or ring-direction bug, invisible at 2, shows). Every check computes the
one-process answer with plain torch in the same process and returns how far this rank's
parallel answer is from it."""

from __future__ import annotations

import datetime
import os
import time
from typing import Any

import torch
import torch.nn.functional as F

WORLD = 2


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """(L, H, D) attention with GQA, the one-device way."""
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                         v.transpose(0, 1)[None], enable_gqa=True)
    return out[0].transpose(0, 1)


def check_ulysses(mesh: Any) -> float:
    """Chunks of q (4 heads per rank) and GQA k, v (1 head per rank: Nano's 32 / 8 ratio) ->
    head groups in one all-to-all -> attention -> back == the full attention's chunk."""
    from worldserve.levers.parallel.attention import gather_heads, scatter_heads_many

    size = mesh.world.size
    g = torch.Generator().manual_seed(1)
    q = torch.randn(12, 4 * size, 8, generator=g)
    k, v = (torch.randn(12, size, 8, generator=g) for _ in range(2))
    chunk = 12 // size
    mine = slice(mesh.rank * chunk, (mesh.rank + 1) * chunk)
    heads_q, heads_k, heads_v = scatter_heads_many([q[mine], k[mine], v[mine]], mesh.world)
    out = gather_heads(_sdpa(heads_q, heads_k, heads_v), mesh.world)
    return float((out - _sdpa(q, k, v)[mine]).abs().max())


def check_ring(mesh: Any) -> float:
    """Ring attention over padded, unequal chunks plus a replicated prefix == full attention."""
    from worldserve.levers.parallel.attention import ring_attention

    size = mesh.world.size
    g = torch.Generator().manual_seed(2)
    # 11 rows do not divide over 2, 3 or 4 ranks: the last chunk is part padding
    real = 11
    chunk = -(-real // size)
    valid = [min(chunk, max(0, real - i * chunk)) for i in range(size)]
    q = torch.randn(real, 4, 8, generator=g)
    k, v = (torch.randn(real, 2, 8, generator=g) for _ in range(2))
    pk, pv = (torch.randn(3, 2, 8, generator=g) for _ in range(2))
    pad = lambda x: torch.cat((x, x.new_zeros((size * chunk - real, *x.shape[1:]))))  # noqa: E731
    mine = slice(mesh.rank * chunk, (mesh.rank + 1) * chunk)
    # k/v keep their 2 (GQA) heads round the ring: ring_attention repeats them where it reads
    out = ring_attention(pad(q)[mine], pad(k)[mine], pad(v)[mine], mesh.world, valid,
                         prefix=(pk, pv))
    ref = _sdpa(q, torch.cat((pk, k)), torch.cat((pv, v)))
    rows = min(chunk, real - mesh.rank * chunk)
    return float((out[:rows] - ref[mine][:rows]).abs().max())


def check_shard(mesh: Any) -> dict[str, float]:
    """Blocks sharded over the group give the same output as the whole blocks, holding half."""
    from worldserve.levers.parallel.shard import ShardedBlocks

    torch.manual_seed(3)
    blocks = [torch.nn.Sequential(torch.nn.Linear(5, 5), torch.nn.LayerNorm(5)) for _ in range(3)]
    x = torch.randn(4, 5)
    ref = x
    for block in blocks:
        ref = block(ref)
    full_bytes = sum(p.nbytes for b in blocks for p in b.parameters())
    shards = ShardedBlocks.from_module(blocks, mesh.world)
    out = x
    with torch.no_grad():
        for block in blocks:
            out = block(out)
    empty = all(p.numel() == 0 for b in blocks for p in b.parameters())
    return {"diff": float((out - ref.detach()).abs().max()), "released": float(empty),
            "local_fraction": shards.local_bytes() / full_bytes}


def check_halo(mesh: Any) -> float:
    """Two 3x3 convolutions on row strips with halo exchange == on the whole picture."""
    from worldserve.levers.parallel.halo import gather_rows, split_rows, with_halo

    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 3, 9, 7, generator=g)
    w1, w2 = torch.randn(4, 3, 3, 3, generator=g), torch.randn(3, 4, 3, 3, generator=g)
    ref = F.conv2d(F.conv2d(x, w1, padding=1), w2, padding=1)
    first, end = split_rows(9, mesh.world.size)[mesh.rank]  # unequal strips
    strip = x[:, :, first:end]
    strip = F.conv2d(with_halo(strip, mesh.world, 1, 2), w1, padding=(0, 1))
    strip = F.conv2d(with_halo(strip, mesh.world, 1, 2), w2, padding=(0, 1))
    whole, start = gather_rows(strip, mesh.world, 2)
    assert start == first
    return float((whole - ref).abs().max())


def check_dead_peer(mesh: Any) -> dict[str, Any]:
    """Rank 1 exits; rank 0's next collective fails with CollectiveError, promptly."""
    from worldserve.levers.parallel.comm import CollectiveError, all_gather

    if mesh.rank == 1:
        time.sleep(0.3)
        os._exit(0)
    start = time.monotonic()
    try:
        all_gather(torch.ones(3), mesh.world)
    except CollectiveError as exc:
        return {"raised": True, "seconds": time.monotonic() - start, "message": str(exc)}
    return {"raised": False, "seconds": time.monotonic() - start, "message": ""}


def entry(rank: int, port: int, results: Any, world: int = WORLD) -> None:
    """One rank: join the gloo group, run every check, put its results on the queue keyed by
    rank (then, in a group of 2, the dead-peer check)."""
    import torch.distributed as dist

    from worldserve.levers.parallel.mesh import ParallelLayout, RankMesh

    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0,
                          timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))
    mesh = RankMesh(ParallelLayout(ulysses=world), rank)
    mesh.build(30)
    results.put({rank: {"ulysses": check_ulysses(mesh), "ring": check_ring(mesh),
                        "shard": check_shard(mesh), "halo": check_halo(mesh)}})
    if world == WORLD:
        results.put({"dead_peer": check_dead_peer(mesh)})
    else:
        dist.barrier()  # no rank leaves while another still needs it
        dist.destroy_process_group()
