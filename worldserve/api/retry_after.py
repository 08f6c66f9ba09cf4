"""`Retry-After` for shed requests: when a slot is likely to free, from how long slots are held.

Each admission point that sheds load with 503 (native media requests in flight, live reasoning
session slots, realtime session slots) keeps a `SlotClock`: an exponentially weighted mean of
how long its slots were held, and the start times of the slots held now. A slot should free
when the oldest one reaches the mean hold time; `retry_after_s()` is that wait, bounded to
[`floor_s`, `ceiling_s`] (before any slot was released there is no measurement: `floor_s`).
"""

from __future__ import annotations

import itertools
import math
import time

EWMA_WEIGHT = 0.2  # weight of the newest hold time
FLOOR_S = 1.0
CEILING_S = 60.0


class SlotClock:
    def __init__(self, floor_s: float = FLOOR_S, ceiling_s: float = CEILING_S) -> None:
        self.floor_s = floor_s
        self.ceiling_s = ceiling_s
        self.mean_hold_s: float | None = None
        self._started_s: dict[int, float] = {}
        self._tokens = itertools.count(1)

    def hold(self, now_s: float | None = None) -> int:
        """A slot was taken; the token releases it."""
        token = next(self._tokens)
        self._started_s[token] = time.monotonic() if now_s is None else now_s
        return token

    def release(self, token: int, measured: bool = True, now_s: float | None = None) -> None:
        """The slot was freed (idempotent); `measured=False` leaves its hold time out of the
        mean (a hold that continues as another one)."""
        started = self._started_s.pop(token, None)
        if started is None or not measured:
            return
        held_s = (time.monotonic() if now_s is None else now_s) - started
        self.mean_hold_s = held_s if self.mean_hold_s is None else (
            EWMA_WEIGHT * held_s + (1 - EWMA_WEIGHT) * self.mean_hold_s)

    def estimate_s(self, now_s: float | None = None) -> float | None:
        """Seconds until the oldest held slot reaches the mean hold time (None: no slot was
        released yet, or none is held)."""
        if self.mean_hold_s is None or not self._started_s:
            return None
        now_s = time.monotonic() if now_s is None else now_s
        return self.mean_hold_s - (now_s - min(self._started_s.values()))

    def retry_after_s(self, *more_estimates_s: float, now_s: float | None = None) -> float:
        """The soonest of this clock's estimate and `more_estimates_s` (other ways the admission
        point knows a slot frees), bounded; `floor_s` when nothing is known."""
        known = [e for e in (self.estimate_s(now_s), *more_estimates_s) if e is not None]
        return min(self.ceiling_s, max(self.floor_s, min(known))) if known else self.floor_s


def header_value(seconds: float) -> str:
    """`Retry-After` takes whole seconds (RFC 9110 §10.2.3): rounded up, at least 1."""
    return str(max(1, math.ceil(seconds)))
