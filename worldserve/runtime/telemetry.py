"""Engine figures a stage measures about itself, for the api's `/metrics`.

The stage loop times every engine step and every request from submit to its terminal reply,
and counts the tokens its replies carry. They travel in the stats reply it already sends
(`StageStats.extra["telemetry"]`, plain numbers), as cumulative Prometheus histograms, so the
api renders them without keeping any state of its own and a restarted stage simply starts
again from zero (a counter reset, which Prometheus' `rate()` handles).
"""

from __future__ import annotations

import bisect
import time
from typing import Any, Callable

from worldserve.ipc.messages import (
    ChatResult,
    ErrorReply,
    FrameResult,
    Message,
    Request,
)

# Seconds: from a 1 ms relay-sized step to a 5-minute video job.
BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
             30.0, 60.0, 300.0)
# Request kinds timed from submit to terminal reply, by wire type (what the api asks).
TIMED_REQUESTS = {
    "GenerateMedia": "generate_media",
    "GenerateActions": "generate_actions",
    "SessionFrame": "session_frame",
    "ChatCompletion": "chat_completion",
    "RealtimeChunk": "realtime_chunk",
}

ReplyFn = Callable[[Message], None]


class Histogram:
    """Counts per bucket upper bound (plus +Inf), a sum and a count."""

    def __init__(self, bounds: tuple[float, ...] = BUCKETS_S) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def snapshot(self) -> dict[str, Any]:
        """Prometheus' shape: cumulative counts for `le` = each bound, then +Inf."""
        cumulative, total = [], 0
        for count in self.counts:
            total += count
            cumulative.append(total)
        return {"le": list(self.bounds), "cumulative": cumulative, "sum": self.sum}


class StageTelemetry:
    def __init__(self) -> None:
        self.step_s = Histogram()
        self.request_s: dict[str, Histogram] = {}
        self.generated_tokens = 0
        self.failed_requests = 0

    def observe_step(self, seconds: float) -> None:
        self.step_s.observe(seconds)

    def timed(self, request: Request, reply: ReplyFn) -> ReplyFn:
        """`reply`, also recording the request's latency at its terminal reply and its tokens."""
        kind = TIMED_REQUESTS.get(type(request).__name__)
        if kind is None:
            return reply
        started = time.perf_counter()

        def observed(out: Message) -> None:
            self._count(out)
            if getattr(out, "terminal", False):
                histogram = self.request_s.setdefault(kind, Histogram())
                histogram.observe(time.perf_counter() - started)
            reply(out)

        return observed

    def _count(self, out: Message) -> None:
        if isinstance(out, FrameResult):
            self.generated_tokens += out.token_count
        elif isinstance(out, ChatResult):
            self.generated_tokens += out.completion_tokens
        elif isinstance(out, ErrorReply):
            self.failed_requests += 1

    def snapshot(self) -> dict[str, Any]:
        return {"step_seconds": self.step_s.snapshot(),
                "request_seconds": {k: h.snapshot() for k, h in self.request_s.items()},
                "generated_tokens": self.generated_tokens,
                "failed_requests": self.failed_requests}
