"""`docs/architecture.md` is current: `python -m tools.architecture` renders it from the tree and
from the layering test's rules (tests/unit/test_layering.py); a change to either makes the
committed page stale until it is regenerated."""

from __future__ import annotations

import pytest

from tests.unit import test_layering as rules
from tools import architecture


def test_the_committed_page_is_current() -> None:
    assert architecture.DOC.read_text() == architecture.render(), (
        "docs/architecture.md is stale: run `python -m tools.architecture`")


def test_a_changed_rule_changes_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    page = architecture.render()
    monkeypatch.setattr(rules, "MODEL_SHARED", ("types", "detect"))  # common.py changes room
    assert architecture.render() != page


def test_the_table_reads_the_rules() -> None:
    table = architecture.rooms_table(architecture.collect())
    api_row = next(line for line in table.splitlines() if "| api |" in line)
    assert "`torch`" in api_row and "`ranks`" in api_row
    assert "0 of them back up a floor; 0 import circles" in table


def test_a_room_without_a_role_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(architecture.ROLES, "levers")
    with pytest.raises(SystemExit, match="levers"):
        architecture.collect()
