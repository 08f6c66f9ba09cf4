"""Rank 0's peer watch on NCCL (where a collective with a dead peer blocks instead of raising):
the abort fires once, promptly, when a peer process exits, and never after `stop()`. The NCCL
abort itself is unverified here (no GPU): a recorder stands in for it."""

from __future__ import annotations

import subprocess
import sys
import time

from worldserve.ranks.group import PeerWatch


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_peer_that_exits_aborts_the_group_once_and_promptly():
    peers = {1: sleeper(), 2: sleeper()}
    aborts: list[float] = []
    watch = PeerWatch(peers, lambda: aborts.append(time.monotonic()), period_s=0.02)
    try:
        time.sleep(0.2)
        assert aborts == []  # everyone alive: nothing to abort
        killed = time.monotonic()
        peers[2].kill()
        deadline = time.monotonic() + 5
        while not aborts and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(aborts) == 1 and aborts[0] - killed < 1.0
        assert watch.fired is not None and watch.fired.startswith("rank 2 ")
        time.sleep(0.1)
        assert len(aborts) == 1
    finally:
        watch.stop()
        for proc in peers.values():
            proc.kill()
            proc.wait()


def test_a_stopped_watch_never_aborts():
    peers = {1: sleeper()}
    aborts: list[int] = []
    watch = PeerWatch(peers, lambda: aborts.append(1), period_s=0.02)
    watch.stop()  # what the group's teardown does before it kills its peers
    peers[1].kill()
    peers[1].wait()
    time.sleep(0.1)
    assert aborts == [] and watch.fired is None
