"""`RestartPolicy`: the delays before restarting a dead non-critical stage, and when the
supervisor gives up (runtime/restart.py); `stop_progress`: what the supervisor says when it has
to SIGKILL a stage after SIGTERM."""

from __future__ import annotations

from worldserve.config import StageConfig
from worldserve.runtime.restart import RestartPolicy
from worldserve.runtime.supervisor import StageProcess, stop_progress


def test_delays_double_and_the_budget_is_per_window() -> None:
    policy = RestartPolicy(max_restarts=3, window_s=100.0, first_delay_s=1.0, max_delay_s=3.0)
    assert [policy.on_death(t) for t in (0.0, 1.0, 2.0)] == [1.0, 2.0, 3.0]  # capped at 3
    assert policy.on_death(3.0) is None  # a 4th death inside 100 s: stay down
    # Deaths older than the window no longer count: the stage earns its restarts back.
    assert policy.on_death(150.0) == 1.0
    assert policy.num_recent_deaths == 1


def _stage(lines: list[str]) -> StageProcess:
    stage = StageProcess("reasoner", StageConfig(), "ipc:///nowhere", client=None)  # type: ignore[arg-type]
    stage.stderr_tail.extend(lines)
    return stage


def test_stop_progress_reads_the_stage_own_lines() -> None:
    assert "never acknowledged" in stop_progress(_stage(["loading weights"]))
    received = "stage reasoner: SIGTERM received; stopping after the current step"
    assert "current step had not finished" in stop_progress(_stage([received]))
    stopped = "INFO [reasoner] worldserve.stage: stage reasoner stopped 0.05 s after SIGTERM"
    assert "still exiting" in stop_progress(_stage([received, stopped]))
