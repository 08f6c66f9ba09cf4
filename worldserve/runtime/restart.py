"""When the supervisor restarts a non-critical stage that died (pure logic, no processes).

A stage that dies is restarted after a delay that doubles with each death inside the window
(2 s, 4 s, 8 s ... up to `max_delay_s`); after `max_restarts` deaths within `window_s` it stays
down (its routes answer 503, `/health` says `unhealthy`) and the log says so, so that a stage
that cannot stay up (a corrupt model, a device fault) does not restart forever.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

MAX_RESTARTS = 5
RESTART_WINDOW_S = 600.0
FIRST_DELAY_S = 2.0
MAX_DELAY_S = 30.0


@dataclass
class RestartPolicy:
    max_restarts: int = MAX_RESTARTS
    window_s: float = RESTART_WINDOW_S
    first_delay_s: float = FIRST_DELAY_S
    max_delay_s: float = MAX_DELAY_S
    _deaths_s: collections.deque[float] = field(default_factory=collections.deque)

    def on_death(self, now_s: float) -> float | None:
        """Seconds to wait before restarting a stage that died at `now_s`; None: give up."""
        while self._deaths_s and self._deaths_s[0] <= now_s - self.window_s:
            self._deaths_s.popleft()
        self._deaths_s.append(now_s)
        recent = len(self._deaths_s)
        if recent > self.max_restarts:
            return None
        return min(self.max_delay_s, self.first_delay_s * 2 ** (recent - 1))

    @property
    def num_recent_deaths(self) -> int:
        return len(self._deaths_s)
