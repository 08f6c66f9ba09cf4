"""The soak's tally excuses a 5xx by every fault in progress, not only the first one it names."""

from __future__ import annotations

import httpx

from benchmarks.soak_tally import Tally


def _storage_full() -> httpx.Response:
    return httpx.Response(507, json={"error": {"code": "storage_full", "type": "server_error"}},
                          request=httpx.Request("DELETE", "http://soak/v1/videos/a"))


def test_a_507_while_the_disk_is_full_is_documented_also_when_a_stage_restarts_meanwhile() -> None:
    tally = Tally()
    tally.disk_full = True
    tally.restarting.add("reasoner")  # the window now reads "a stage restarting"
    tally.record("cancel_delete", 507, _storage_full())
    assert tally.violations == []
    assert tally.fivexx == {"507 storage_full (a stage restarting)": 1}


def test_a_507_with_the_disk_not_full_is_a_violation_whatever_restarts() -> None:
    tally = Tally()
    tally.restarting.add("reasoner")
    tally.record("cancel_delete", 507, _storage_full())
    assert len(tally.violations) == 1 and "507 storage_full" in tally.violations[0]
