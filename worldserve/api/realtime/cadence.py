"""Delivery cadence of one realtime session, as its viewer lives it (both protocols).

Per chunk written to the socket: the time from session start to the first chunk, the interval
since the previous chunk, the real-time factor of that interval (media seconds delivered / wall
seconds taken; >= 1 keeps up with playback) and stalls. A stall is a chunk that arrives after
the media already delivered ran out, i.e. a player that started at the first chunk would have
frozen; playback then restarts from that chunk (the buffer is empty again).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from worldserve.api.metrics import RealtimeCadenceMetrics


@dataclass
class CadenceTracker:
    protocol: str  # the metrics label: "sglang" or "vllm_omni"
    fps: float
    metrics: RealtimeCadenceMetrics
    started_at: float = field(default_factory=time.monotonic)
    _last_at: float | None = None
    _playback_started_at: float = 0.0
    _media_s: float = 0.0  # media delivered since playback (re)started

    def chunk_sent(self, num_frames: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        chunk_media_s = num_frames / self.fps if self.fps > 0 else 0.0
        if self._last_at is None:
            self.metrics.first_chunk(self.protocol, now - self.started_at)
            self._playback_started_at = now
        else:
            interval_s = now - self._last_at
            stalled = now - self._playback_started_at > self._media_s
            if stalled:
                self._playback_started_at, self._media_s = now, 0.0
            self.metrics.interval(self.protocol, interval_s, chunk_media_s, stalled)
        self._media_s += chunk_media_s
        self._last_at = now
