"""Prometheus metrics of one server (its own registry: no global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


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

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        self.requests.labels(route, method, str(status)).inc()
        self.latency.labels(route, method).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
