"""The generic rank-group pieces (levers/parallel) in real gloo groups of 2, 3 and 4 ranks:
Ulysses all-to-all (GQA at Nano's 4:1 head ratio), ring attention over lengths that do not
divide evenly, sharded blocks and halo convolutions each equal their one-process computation on
every rank; a collective whose peer died fails promptly instead of hanging."""

from __future__ import annotations

import queue as queue_module
import socket
import time

import pytest
import torch.multiprocessing as mp

from tests.support import rank_checks


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_group(world: int, expected: int) -> dict:
    """Spawn a gloo group of `world` ranks running rank_checks.entry; `expected` result keys."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=rank_checks.entry, args=(rank, port, queue, world))
             for rank in range(world)]
    for proc in procs:
        proc.start()
    out: dict = {}
    deadline = time.monotonic() + 60 + 30 * world
    while len(out) < expected and time.monotonic() < deadline:
        try:
            out.update(queue.get(timeout=1))
        except queue_module.Empty:
            failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            assert not failed, f"a rank process failed (exit codes {failed}); see its output"
    for proc in procs:
        proc.join(timeout=30)
    return out


@pytest.fixture(scope="module")
def results() -> dict:
    out = run_group(rank_checks.WORLD, rank_checks.WORLD + 1)
    return {**out[0], "dead_peer": out["dead_peer"]}


def test_ulysses_all_to_all_equals_full_attention_bit_for_bit(results):
    assert results["ulysses"] == 0.0


def test_ring_attention_equals_full_attention(results):
    assert results["ring"] < 1e-6


def test_sharded_blocks_compute_the_same_and_hold_half(results):
    shard = results["shard"]
    assert shard["diff"] == 0.0
    assert shard["released"] == 1.0  # full weights dropped after each block's forward
    assert 0.45 < shard["local_fraction"] <= 0.6  # half, plus the padding of odd row counts


def test_halo_convolutions_equal_the_whole_picture(results):
    assert results["halo"] == 0.0


@pytest.mark.parametrize("world", [3, 4])
def test_every_rank_of_three_and_four_equals_one_process(world):
    """Ring of 3 and 4 over 11 rows (chunks 4,4,3 and 3,3,3,2), Ulysses with one K/V head per
    rank for four query heads, shards and halo strips that do not divide evenly: every rank's
    own output is compared, not only rank 0's."""
    out = run_group(world, world)
    assert sorted(out) == list(range(world))
    for rank, checks in out.items():
        assert checks["ulysses"] == 0.0, rank
        assert checks["ring"] < 1e-6, rank
        assert checks["shard"]["diff"] == 0.0 and checks["shard"]["released"] == 1.0, rank
        # every parameter has 5 rows on dim 0: ceil(5 / world) of them per rank (padded)
        assert checks["shard"]["local_fraction"] == pytest.approx(-(-5 // world) / 5), rank
        assert checks["halo"] == 0.0, rank


def test_a_dead_peer_fails_the_collective_promptly(results):
    dead = results["dead_peer"]
    assert dead["raised"], dead
    assert dead["seconds"] < 10  # the peer's socket closes: no wait for the 30 s timeout
    assert "all_gather over ranks [0, 1] failed" in dead["message"]
