"""The generic rank-group pieces (levers/parallel) in a real two-process gloo group: Ulysses
all-to-all, ring attention, sharded blocks and halo convolutions each equal their one-process
computation, and a collective whose peer died fails promptly instead of hanging."""

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


@pytest.fixture(scope="module")
def results() -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=rank_checks.entry, args=(rank, port, queue))
             for rank in range(rank_checks.WORLD)]
    for proc in procs:
        proc.start()
    out: dict = {}
    deadline = time.monotonic() + 120
    while len(out) < 5 and time.monotonic() < deadline:
        try:
            out.update(queue.get(timeout=1))
        except queue_module.Empty:
            failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            assert not failed, f"a rank process failed (exit codes {failed}); see its output"
    for proc in procs:
        proc.join(timeout=30)
    return out


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


def test_a_dead_peer_fails_the_collective_promptly(results):
    dead = results["dead_peer"]
    assert dead["raised"], dead
    assert dead["seconds"] < 10  # the peer's socket closes: no wait for the 30 s timeout
    assert "all_gather over ranks [0, 1] failed" in dead["message"]
