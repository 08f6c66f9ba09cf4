"""A colocated stage process: the host engine (generation) lets its guests (the reasoner) run
inside its own steps.

`run_together` (runtime/stage.py) alternates the stage loops' turns; with
`stages.reasoner.colocation_yield: blocks` the host engine also calls `yield_point()` before
each transformer block of its forward (levers/yielding.py), and the guests take turns there
while they have work, for at most `max_yield_s` per yield point. A guest's token then waits
for one block of the host's forward instead of a whole denoising step. With `steps` only the
alternation of whole turns remains (one guest turn per host step).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Protocol, runtime_checkable

log = logging.getLogger("worldserve.colocation")


@runtime_checkable
class YieldingEngine(Protocol):
    """An engine whose steps can pause at yield points (the generation engine)."""

    def set_yield_point(self, yield_point: Callable[[], None] | None) -> int:
        """Call `yield_point()` at every pause point of the coming steps (None: none); the
        number of pause points per forward (0: the model offers none)."""


class StageTurns(Protocol):
    """What a colocation needs of a stage loop (runtime/stage.py `StageLoop`)."""

    stage: str
    engine: Any
    running: bool

    def beat(self, idle_ms: float) -> bool:
        """One turn of the stage; True when its engine had work."""


class Colocation:
    """The guests' turns taken at the host's yield points."""

    def __init__(self, guests: list[StageTurns], max_yield_s: float) -> None:
        self.guests = guests
        self.max_yield_s = max_yield_s
        self._inside = False
        self.num_yields = 0  # yield points reached, and guest turns taken at them
        self.num_guest_turns = 0
        # A guest turn that raised: kept and re-raised by `raise_guest_error()` after the
        # host's step, so that it is neither blamed on the host's job nor swallowed by it.
        self.guest_error: BaseException | None = None

    def yield_point(self) -> None:
        """Run guest turns while a guest has work (or a message waits), up to `max_yield_s`."""
        if self._inside or self.guest_error is not None:  # no nesting; no turns after a crash
            return
        self._inside = True
        self.num_yields += 1
        try:
            deadline = time.perf_counter() + self.max_yield_s
            while True:
                busy = False
                for guest in self.guests:
                    if guest.running and guest.beat(0):
                        busy = True
                        self.num_guest_turns += 1
                if not busy or time.perf_counter() >= deadline:
                    return
        except BaseException as exc:
            self.guest_error = exc
        finally:
            self._inside = False

    def raise_guest_error(self) -> None:
        """Re-raise a guest turn's exception outside the host's step (as a turn of its own
        loop would have raised it)."""
        if self.guest_error is not None:
            error, self.guest_error = self.guest_error, None
            raise error


def install(host: StageTurns, guests: list[StageTurns], mode: str,
            max_yield_ms: float) -> Colocation | None:
    """Give the host engine a yield point that runs the guests (`mode` "blocks"); None when
    the mode is "steps" or the host's model has no blocks to pause at."""
    if mode != "blocks":
        return None
    engine: Any = host.engine
    if not isinstance(engine, YieldingEngine):
        log.warning("colocation_yield 'blocks': the %s engine cannot pause inside its steps; "
                    "the stages alternate whole steps", host.stage)
        return None
    colocation = Colocation(guests, max_yield_ms / 1000)
    num_points = engine.set_yield_point(colocation.yield_point)
    if num_points == 0:
        engine.set_yield_point(None)
        log.warning("colocation_yield 'blocks': the %s model has no repeated blocks to pause "
                    "at; the stages alternate whole steps", host.stage)
        return None
    log.info("colocated: the %s forward yields to %s before each of its %d blocks", host.stage,
             "+".join(g.stage for g in guests), num_points)
    return colocation


def uninstall(host: StageTurns) -> None:
    engine: Any = host.engine
    if isinstance(engine, YieldingEngine):
        engine.set_yield_point(None)
