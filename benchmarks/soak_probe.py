"""The soak's probe (benchmarks/soak.py): samples a running server every few seconds from the
outside, and turns the samples into the verdicts of the soak's JSON line and a PNG plot.

A sample: RSS and open file descriptors of the api process and of every stage process (the
stage pids come from `/admin/server_info`, so a restarted stage is followed under its new
pid), the SQLite record store's size, the output directory's bytes, and per stage the sessions
open and the queue depth (`/admin/stats`)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness import rss_mb

MB = 1024 * 1024


def num_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def tree_bytes(root: Path) -> int:
    total = 0
    for path in root.rglob("*"):
        try:
            total += path.stat().st_size if path.is_file() else 0
        except OSError:  # deleted by retention while walking
            pass
    return total


@dataclass
class Sample:
    t_s: float
    rss_mb: dict[str, float]
    fds: dict[str, int]
    pids: dict[str, int]
    sqlite_bytes: int
    output_bytes: int
    sessions: dict[str, int]
    queue_depth: dict[str, int]


@dataclass
class Probe:
    base_url: str
    api_pid: int
    output_dir: Path
    started_s: float = field(default_factory=time.monotonic)
    samples: list[Sample] = field(default_factory=list)

    def sample(self, http: httpx.Client) -> Sample:
        pids = {"api": self.api_pid}
        sessions, queues = {}, {}
        try:
            info = http.get(f"{self.base_url}/admin/server_info", timeout=5).json()
            pids.update({name: s["pid"] for name, s in info["stages"].items() if s.get("pid")})
            stats = http.get(f"{self.base_url}/admin/stats", timeout=5).json()["stages"]
            sessions = {n: int(s.get("sessions") or 0) for n, s in stats.items()}
            queues = {n: int(s.get("queue_depth") or 0) for n, s in stats.items()}
        except (httpx.HTTPError, KeyError, ValueError):
            pass  # a stage restarting: this sample has the api only
        store = self.output_dir / ".worldserve"
        sample = Sample(
            t_s=time.monotonic() - self.started_s,
            rss_mb={n: v for n, p in pids.items() if (v := rss_mb(p)) is not None},
            fds={n: v for n, p in pids.items() if (v := num_fds(p)) is not None},
            pids=pids, sqlite_bytes=tree_bytes(store) if store.exists() else 0,
            output_bytes=tree_bytes(self.output_dir), sessions=sessions, queue_depth=queues)
        self.samples.append(sample)
        return sample


def slope_per_hour(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares slope of (t_s, value) in value/hour, and its standard error (residuals
    taken as independent)."""
    fit = _fit(points)
    if fit is None:
        return 0.0, math.inf
    slope, centred, residuals, sxx = fit
    n = len(points)
    return slope * 3600, math.sqrt(sum(e * e for e in residuals) / (n - 2) / sxx) * 3600


def slope_stderr_correlated(points: list[tuple[float, float]], lag_s: float) -> float:
    """The slope's standard error in value/hour when residuals within `lag_s` of each other are
    correlated (Newey-West, Bartlett weights): RSS moves in steps and saw-teeth minutes long
    (a stage's restart, glibc's arenas), so neighbouring samples are not independent draws and
    `slope_per_hour`'s error is too small for them."""
    fit = _fit(points)
    if fit is None:
        return math.inf
    _, centred, residuals, sxx = fit
    scores = [x * e for x, e in zip(centred, residuals)]
    step_s = (points[-1][0] - points[0][0]) / (len(points) - 1)
    lags = min(len(points) - 1, int(lag_s / step_s)) if step_s > 0 else 0
    variance = sum(u * u for u in scores)
    for lag in range(1, lags + 1):
        weight = 1 - lag / (lags + 1)
        variance += 2 * weight * sum(a * b for a, b in zip(scores[lag:], scores[:-lag]))
    return math.sqrt(max(variance, 0.0)) / sxx * 3600


def _fit(points: list[tuple[float, float]]
         ) -> tuple[float, list[float], list[float], float] | None:
    """(slope per second, centred times, residuals, sum of squared centred times); None when
    fewer than 3 points or one time."""
    n = len(points)
    if n < 3:
        return None
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    centred = [t - mean_t for t, _ in points]
    sxx = sum(x * x for x in centred)
    if sxx == 0:
        return None
    slope = sum(x * (v - mean_v) for x, (_, v) in zip(centred, points)) / sxx
    residuals = [v - mean_v - slope * x for x, (_, v) in zip(centred, points)]
    return slope, centred, residuals, sxx


def last_half(samples: list[Sample]) -> list[Sample]:
    if not samples:
        return []
    cut = samples[-1].t_s / 2
    return [s for s in samples if s.t_s >= cut]


def one_process(samples: list[Sample], name: str, key: str) -> list[tuple[float, float]]:
    """(t, value) of process `name` over its longest run under one pid (restarts split it)."""
    runs: dict[int, list[tuple[float, float]]] = {}
    for s in samples:
        value = getattr(s, key).get(name)
        if value is not None and name in s.pids:
            runs.setdefault(s.pids[name], []).append((s.t_s, float(value)))
    return max(runs.values(), key=len, default=[])


def verdicts(samples: list[Sample], correlated_s: float) -> dict[str, Any]:
    """RSS slope (MB/h ± standard error, and the error with residuals correlated over
    `correlated_s`: the soak's fault period) and fd slope per process over the last half, and
    whether retention kept the output directory bounded."""
    half = last_half(samples)
    names = sorted({n for s in samples for n in s.rss_mb})
    rss, fds = {}, {}
    for name in names:
        points = one_process(half, name, "rss_mb")
        slope, err = slope_per_hour(points)
        rss[name] = {"slope_mb_per_h": round(slope, 1), "stderr_mb_per_h": round(err, 1),
                     "stderr_correlated_mb_per_h": round(
                         slope_stderr_correlated(points, correlated_s), 1),
                     # the longest stretch under one pid: a restart cuts the fit short
                     "over_s": round(points[-1][0] - points[0][0]) if points else 0}
        points = one_process(half, name, "fds")
        values = [v for _, v in points]
        fds[name] = {"min": min(values, default=0), "max": max(values, default=0),
                     "slope_per_h": round(slope_per_hour(points)[0], 1)}
    first = [s.output_bytes for s in samples if s not in half]
    second = [s.output_bytes for s in half]
    bounded = bool(second) and max(second) <= 1.5 * max(first or [0]) + 32 * MB
    return {
        "rss_last_half": rss,
        "fds_last_half": fds,
        "output_dir_mb": {"max_first_half": round(max(first, default=0) / MB, 1),
                          "max_last_half": round(max(second, default=0) / MB, 1),
                          "end": round(samples[-1].output_bytes / MB, 1) if samples else 0},
        "output_dir_bounded": bounded,
        "sqlite_kb_end": round(samples[-1].sqlite_bytes / 1024, 1) if samples else 0,
        "max_sessions_open": {n: max(s.sessions.get(n, 0) for s in samples)
                              for n in sorted({n for s in samples for n in s.sessions})},
        # after the load stopped and every client closed or deleted its sessions: 0 each, or
        # the stage holds sessions nothing will release
        "sessions_open_at_end": samples[-1].sessions if samples else {},
        "max_queue_depth": {n: max(s.queue_depth.get(n, 0) for s in samples)
                            for n in sorted({n for s in samples for n in s.queue_depth})},
    }


def write_samples(samples: list[Sample], path: Path) -> str:
    """One JSON line per sample; returns the path written."""
    path.write_text("".join(json.dumps(dataclasses.asdict(s)) + "\n" for s in samples))
    return str(path)


def plot(samples: list[Sample], kills: list[tuple[float, str]], path: Path) -> str:
    """Four panels (RSS, fds, output dir + SQLite, sessions + queues) with the kills marked;
    matplotlib (the dev extra). Returns the path written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
    minutes = [s.t_s / 60 for s in samples]
    for name in sorted({n for s in samples for n in s.rss_mb}):
        axes[0].plot(minutes, [s.rss_mb.get(name, math.nan) for s in samples], label=name)
        axes[1].plot(minutes, [s.fds.get(name, math.nan) for s in samples], label=name)
    axes[2].plot(minutes, [s.output_bytes / MB for s in samples], label="output dir (MB)")
    axes[2].plot(minutes, [s.sqlite_bytes / MB for s in samples], label="SQLite (MB)")
    for name in sorted({n for s in samples for n in s.sessions}):
        axes[3].plot(minutes, [s.sessions.get(name, 0) for s in samples],
                     label=f"{name} sessions")
        axes[3].plot(minutes, [s.queue_depth.get(name, 0) for s in samples], linestyle=":",
                     label=f"{name} queue")
    titles = ("RSS (MB)", "open file descriptors", "bytes on disk", "sessions / queue depth")
    for ax, title in zip(axes, titles):
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7, loc="upper left")
        for t_s, stage in kills:
            ax.axvline(t_s / 60, color="red", alpha=0.3)
    axes[0].text(0.99, 0.02, "red: a fault (a stage or the api SIGKILLed, a full disk)",
                 transform=axes[0].transAxes, ha="right", fontsize=7, color="red")
    axes[-1].set_xlabel("minutes")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return str(path)
