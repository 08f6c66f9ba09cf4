"""What rank 0's runner does when a phase fails, against a stand-in for the processes (the
real ones: tests/integration/parallel): a collective failure or a peer's error restarts the
group and fails the request with stage_unavailable; rank 0 failing after its peers finished
keeps the group; a batch of an older group fails without reaching the peers; a failed
prepare has the peers drop their batch; a peer found dead while preparing costs the new
request nothing (prepared again on the restarted group)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from worldserve.errors import InvalidRequest, StageUnavailable
from worldserve.levers.parallel.comm import CollectiveError
from worldserve.ranks.group import RankGroupError
from worldserve.ranks.messages import DenoiseStep, PrepareBatch, RankCommand
from worldserve.ranks.runner import RankGroupRunner


class Group:
    """The RankGroup surface the runner uses; `answers` decides each peer's reply."""

    def __init__(self) -> None:
        self.epoch, self.seq, self.ready = 0, 0, True
        self.sent: list[RankCommand] = []
        self.restarts: list[str] = []
        self.answers: dict[int, str | None] | None = {1: None}  # None: peers never answer
        self.spec = SimpleNamespace(world_size=2, backend="gloo", devices=["cpu", "cpu"],
                                    timeout_s=300.0)

    def send(self, command: RankCommand) -> int:
        self.seq += 1
        command.seq = self.seq
        self.sent.append(command)
        return self.seq

    def wait_done(self, seq: int, timeout_s: float | None = None) -> dict[int, str | None]:
        if self.answers is None:
            raise RankGroupError("ranks [1] did not finish within 2 s")
        return dict(self.answers)

    def restart(self, reason: str) -> None:
        self.restarts.append(reason)
        self.epoch += 1
        self.ready = False

    def join(self) -> None:
        self.ready = True

    def dead_peer(self) -> str | None:
        return None

    def wait_for_dead_peer(self, grace_s: float) -> str | None:
        return None

    def pids(self) -> dict[int, int]:
        return {1: 4242}


class Local:
    """Rank 0's runner: `fail` raises from the next phase."""

    pipe, max_batch_size, size_multiple, temporal_stride, num_params = None, 1, 16, 4, 0
    features = None

    def __init__(self) -> None:
        self.fail: Exception | None = None

    def _phase(self) -> Any:
        if self.fail is not None:
            raise self.fail
        return SimpleNamespace(row_owner=["r"], step_index=0, num_steps=2,
                               done_denoising=False)

    def prepare(self, *args: Any) -> Any:
        return self._phase()

    def denoise_step(self, state: Any) -> None:
        self._phase()

    def connect_ranks(self, timeout_s: float) -> None:
        pass


@pytest.fixture
def parts() -> tuple[RankGroupRunner, Group, Local]:
    group, local = Group(), Local()
    return RankGroupRunner(local, group), group, local  # type: ignore[arg-type]


def test_a_failed_collective_restarts_the_group_and_fails_the_request(parts):
    runner, group, local = parts
    batch = runner.prepare(["r"], [None], [1])
    local.fail = CollectiveError("all_gather over ranks [0, 1] failed: connection closed")
    with pytest.raises(StageUnavailable, match="while denoising step 1: .*restarting"):
        runner.denoise_step(batch)
    assert len(group.restarts) == 1
    with pytest.raises(RankGroupError, match="progress was lost"):  # an older group's batch
        runner.denoise_step(batch)
    assert isinstance(group.sent[-1], DenoiseStep) and len(group.sent) == 2


def test_a_peer_error_restarts_the_group(parts):
    runner, group, _ = parts
    batch = runner.prepare(["r"], [None], [1])
    group.answers = {1: "CUDA out of memory"}
    with pytest.raises(RankGroupError, match="rank 1 failed: CUDA out of memory"):
        runner.denoise_step(batch)
    assert group.restarts


def test_rank_0_failing_after_its_peers_finished_keeps_the_group(parts):
    runner, group, local = parts
    batch = runner.prepare(["r"], [None], [1])
    local.fail = InvalidRequest("unsafe content")
    with pytest.raises(InvalidRequest, match="unsafe content"):
        runner.denoise_step(batch)
    assert group.restarts == []


def test_rank_0_failing_while_its_peers_wait_restarts_the_group(parts):
    runner, group, local = parts
    batch = runner.prepare(["r"], [None], [1])
    local.fail, group.answers = ValueError("bad shape"), None
    with pytest.raises(ValueError, match="bad shape"):  # the request keeps its own error
        runner.denoise_step(batch)
    assert group.restarts == ["rank 0 failed: bad shape"]


def test_a_prepare_refused_by_rank_0_is_dropped_by_the_peers(parts):
    runner, group, local = parts
    local.fail = InvalidRequest("prompt refused")
    with pytest.raises(InvalidRequest):
        runner.prepare(["r"], [None], [1])
    local.fail = None
    runner.prepare(["r"], [None], [1])
    first, second = group.sent
    assert isinstance(first, PrepareBatch) and second.drop_batches == [first.batch_id]
    assert group.restarts == []


def test_a_peer_that_died_idle_is_replaced_before_the_new_batch(parts):
    runner, group, _ = parts
    outcomes = iter([None, {1: None}])  # the first prepare finds the peer gone

    def wait_done(seq, timeout_s=None):
        outcome = next(outcomes)
        if outcome is None:
            raise RankGroupError("rank 1 (pid 4242) killed by signal SIGKILL while running a step")
        return outcome

    group.wait_done = wait_done
    batch = runner.prepare(["r"], [None], [1])
    assert batch.epoch == 1 and len(group.restarts) == 1
    assert [type(c).__name__ for c in group.sent] == ["PrepareBatch", "PrepareBatch"]
