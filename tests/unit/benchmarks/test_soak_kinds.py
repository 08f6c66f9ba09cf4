"""benchmarks/soak.py --faults: the fault kinds follow the server it runs (a peer-rank kill
only where the generation stage is a rank group) and the plan draws each kind once a cycle."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks import soak
from benchmarks.soak_faults import KINDS, RANK_KILL, plan


def test_a_rank_group_adds_the_peer_rank_kill_to_the_default_kinds() -> None:
    assert soak.parse_args(["--faults"]).kinds == KINDS
    grouped = soak.parse_args(["--faults", "--generation-parallel", "cfg=2"])
    assert grouped.kinds == (*KINDS, RANK_KILL)


def test_a_peer_rank_kill_without_a_rank_group_is_refused() -> None:
    with pytest.raises(SystemExit):
        soak.parse_args(["--faults", "--kinds", f"kill:api,{RANK_KILL}"])


def test_each_kind_once_per_cycle() -> None:
    kinds = (*KINDS, RANK_KILL)
    faults = plan(3, duration_s=600, every_s=50, kinds=kinds)
    assert Counter(kind for _, kind in faults[:len(kinds)]) == Counter(kinds)
    assert all(30 <= t_s <= 570 for t_s, _ in faults)  # first and last 5 % clean
