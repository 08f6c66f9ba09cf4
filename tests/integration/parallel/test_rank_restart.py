"""A peer rank killed before a request's first denoising step (a CFG group of two, this
process as rank 0): killed while the batch is being prepared, the batch is prepared again on
the restarted group and completes; killed between prepare and the first step, the request
fails with a reason naming the rank. Either way the group's next request gives the
one-process output, bit for bit."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from tests.support.rank_groups import group_fixtures, params, run_to_end
from worldserve.errors import StageUnavailable

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
LAYOUT = "cfg=2,vae=false"

group, solo_runner = group_fixtures(LAYOUT)


def kill_peer(group) -> int:
    """SIGKILL rank 1 and reap it: the group sees it dead from now on."""
    proc = group.group.peers[1]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return proc.pid


def test_a_peer_killed_while_preparing_costs_the_batch_nothing(group, solo_runner,
                                                              monkeypatch):
    p = params(num_frames=1, width=32, height=32)
    prepare = group.local.prepare
    killed: list[int] = []

    def prepare_and_lose_the_peer(*args):
        if not killed:  # the first try only: the PrepareBatch is out, the peer dies meanwhile
            killed.append(kill_peer(group))
        return prepare(*args)

    monkeypatch.setattr(group.local, "prepare", prepare_and_lose_the_peer)
    epoch = group.group.epoch
    state = group.prepare(["prepared-twice"], [p], p.seeds)
    assert killed and state.epoch == group.group.epoch == epoch + 1
    assert group.group.pids()[1] != killed[0]
    while not state.done_denoising:
        group.denoise_step(state)
    assert np.array_equal(group.decode(state, 0), run_to_end(solo_runner, p)[0])


def test_a_peer_killed_before_the_first_step_fails_the_request_not_the_next(group,
                                                                            solo_runner):
    p = params(num_frames=1, width=32, height=32, seeds=[5])
    state = group.prepare(["lost"], [p], p.seeds)
    epoch = group.group.epoch
    peer = kill_peer(group)
    with pytest.raises(StageUnavailable, match=f"rank 1 \\(pid {peer}\\) killed by signal "
                                               "SIGKILL.*submit it again"):
        group.denoise_step(state)
    assert group.group.epoch == epoch + 1
    frames, _ = run_to_end(group, p)  # joins the new group
    assert np.array_equal(frames, run_to_end(solo_runner, p)[0])
