"""The stage process starts with the cyclic garbage collector paused (runtime/stage.py
`gc_paused`): off while it imports and loads, on again after, with what the start left
unreachable collected at once."""

from __future__ import annotations

import gc
import weakref

from worldserve.runtime.stage import gc_paused


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_the_collector_is_off_during_the_start_and_on_after() -> None:
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_garbage_cycles_of_the_start_are_collected_when_it_ends() -> None:
    with gc_paused():
        cycle = weakref.ref(Node())
        allocations = [[] for _ in range(10 * gc.get_threshold()[0])]  # past a collection
        assert cycle() is not None  # no automatic collection while paused
    assert cycle() is None
    assert allocations


def test_a_collector_already_off_stays_off() -> None:
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
