"""benchmarks/soak.py --faults: a fault's grace (its window kept open `GRACE_S` after it
recovered, for answers already in flight) lingers in the background, and a restart of the api
that follows takes over from it with no moment in which an answer would find no fault."""

from __future__ import annotations

import pytest

from benchmarks import soak_faults
from benchmarks.soak_faults import STAGES, Injector
from benchmarks.soak_tally import Tally


class FakeServer:
    """The SoakServer calls a `kill:api` restart makes, noting the window each one saw."""

    pid = 1234

    def __init__(self, tally: Tally) -> None:
        self.tally = tally
        self.windows: list[str] = []

    def kill(self) -> None:
        self.windows.append(self.tally.window("reasoner"))

    def start(self) -> float:
        self.windows.append(self.tally.window("reasoner"))
        return 0.0


@pytest.fixture
def short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(soak_faults, "GRACE_S", 0.05)


async def test_a_restart_takes_over_a_lingering_stage_grace(short_grace: None) -> None:
    tally = Tally()
    server = FakeServer(tally)
    injector = Injector(server, tally, disk_hold_s=0.0)  # type: ignore[arg-type]
    tally.restarting.add("reasoner")
    injector._grace(lambda: tally.restarting.discard("reasoner"))
    assert tally.window("reasoner") == "reasoner restarting"  # recovered, grace lingering

    detail = await injector.restart_api(kill_stage=None)

    assert server.windows == ["api restarting", "api restarting"]
    assert detail["api_exit_code"] == -9
    assert tally.api_down and tally.restarting == set(STAGES)  # its own grace now
    await injector.run([], started_s=0.0)  # returns when the last grace is over
    assert not tally.api_down and not tally.restarting and not injector.graces


async def test_a_grace_ends_by_itself_after_grace_s(short_grace: None) -> None:
    tally = Tally()
    injector = Injector(FakeServer(tally), tally, disk_hold_s=0.0)  # type: ignore[arg-type]
    tally.disk_full = True
    injector._grace(lambda: setattr(tally, "disk_full", False))
    assert tally.window(None) == "disk full"
    await injector.run([], started_s=0.0)
    assert tally.window(None) == "no fault"
