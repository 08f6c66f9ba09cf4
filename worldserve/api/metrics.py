"""Prometheus metrics of one server (its own registry: no global state)."""

from __future__ import annotations

from typing import Any, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "worldserve_requests_total", "HTTP requests and WebSocket sessions by route and status",
            ["route", "method", "status"], registry=self.registry,
        )
        self.latency = Histogram(
            "worldserve_request_duration_seconds", "Time to the final response byte",
            ["route", "method"], registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
        )
        self.stage_up = Gauge(
            "worldserve_stage_up", "1 when the stage is ready or holds its weights released "
            "(POST /admin/memory/release), 0 otherwise", ["stage"], registry=self.registry,
        )
        self.weights_released = Gauge(
            "worldserve_stage_weights_released", "1 while the stage's weights are released",
            ["stage"], registry=self.registry,
        )
        self.queue_depth = Gauge(
            "worldserve_stage_queue_depth", "Requests waiting in the stage", ["stage"],
            registry=self.registry,
        )
        self.running = Gauge(
            "worldserve_stage_running", "Requests or sessions the stage is working on", ["stage"],
            registry=self.registry,
        )

        self.realtime_cadence = RealtimeCadenceMetrics(self.registry)
        self.stage_figures = StageFigures()
        self.registry.register(self.stage_figures)

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        self.requests.labels(route, method, str(status)).inc()
        self.latency.labels(route, method).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RealtimeCadenceMetrics:
    """How realtime chunks reach their viewers, per protocol (`protocol`: `sglang` for
    /v1/realtime_video/generate, `vllm_omni` for /v1/realtime/video); fed by
    api/realtime/cadence.py. Inter-chunk p50/p99: `histogram_quantile` over
    `worldserve_realtime_chunk_interval_seconds`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.first_chunk_seconds = Histogram(
            "worldserve_realtime_first_chunk_seconds",
            "From the session's start (its valid init) to its first chunk on the socket",
            ["protocol"], registry=registry,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64),
        )
        self.chunk_interval_seconds = Histogram(
            "worldserve_realtime_chunk_interval_seconds",
            "Time between two consecutive chunks of one session on the socket",
            ["protocol"], registry=registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1, 1.5, 2, 4, 8, 16),
        )
        self.realtime_factor = Histogram(
            "worldserve_realtime_factor",
            "Media seconds a chunk carries / wall seconds since the previous chunk "
            "(>= 1 keeps up with playback)", ["protocol"], registry=registry,
            buckets=(0.1, 0.25, 0.5, 0.75, 0.9, 1, 1.1, 1.25, 1.5, 2, 4, 8),
        )
        self.stalls = Counter(
            "worldserve_realtime_stalls_total",
            "Chunks that arrived after the media delivered before them had run out "
            "(a player started at the first chunk would have frozen)", ["protocol"],
            registry=registry,
        )

    def first_chunk(self, protocol: str, seconds: float) -> None:
        self.first_chunk_seconds.labels(protocol).observe(seconds)

    def interval(self, protocol: str, seconds: float, media_s: float, stalled: bool) -> None:
        self.chunk_interval_seconds.labels(protocol).observe(seconds)
        if seconds > 0:
            self.realtime_factor.labels(protocol).observe(media_s / seconds)
        if stalled:
            self.stalls.labels(protocol).inc()


class StageFigures(Collector):
    """The engine figures of each stage's last stats reply (`extra`, runtime/telemetry.py),
    rendered at scrape time: sessions, KV cache size, generated tokens (its `rate()` is tokens
    per second), step time and per-request latency (a realtime chunk's is
    `request="realtime_chunk"`). A stage that did not answer has no figures in that scrape."""

    def __init__(self) -> None:
        self._stats: dict[str, dict[str, Any]] = {}

    def update(self, stage: str, stats: dict[str, Any] | None) -> None:
        if stats is None:
            self._stats.pop(stage, None)
        else:
            self._stats[stage] = stats

    def collect(self) -> Iterator[Metric]:
        gauges = {
            "sessions": GaugeMetricFamily("worldserve_stage_sessions",
                                          "Live sessions the stage holds", labels=["stage"]),
            "kv_bytes": GaugeMetricFamily("worldserve_stage_kv_bytes",
                                          "Bytes of the sessions' KV caches", labels=["stage"]),
            "kv_tokens": GaugeMetricFamily("worldserve_stage_kv_tokens",
                                           "Tokens in the sessions' KV caches", labels=["stage"]),
        }
        tokens = CounterMetricFamily("worldserve_stage_generated_tokens",
                                     "Tokens decoded (frame replies and chat completions)",
                                     labels=["stage"])
        steps = HistogramMetricFamily("worldserve_stage_step_seconds",
                                      "Duration of one engine step", labels=["stage"])
        requests = HistogramMetricFamily(
            "worldserve_stage_request_seconds",
            "From a request's arrival in the stage to its last reply", labels=["stage", "request"])
        for stage, stats in self._stats.items():
            for key, family in gauges.items():
                value = stats.get(key)
                if isinstance(value, (int, float)):
                    family.add_metric([stage], value)
            telemetry = stats.get("telemetry") or {}
            if not telemetry:
                continue
            tokens.add_metric([stage], telemetry["generated_tokens"])
            steps.add_metric([stage], *_buckets(telemetry["step_seconds"]))
            for kind, histogram in telemetry["request_seconds"].items():
                requests.add_metric([stage, kind], *_buckets(histogram))
        yield from (*gauges.values(), tokens, steps, requests)


def _buckets(snapshot: dict[str, Any]) -> tuple[list[tuple[str, float]], float]:
    """A telemetry histogram snapshot as HistogramMetricFamily's (buckets, sum)."""
    bounds = [*(repr(float(b)) for b in snapshot["le"]), "+Inf"]
    return list(zip(bounds, snapshot["cumulative"])), snapshot["sum"]
