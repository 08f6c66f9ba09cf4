"""Every WORLDSERVE_* environment variable, read here and nowhere else.

Each accessor reads the environment when called, so tests can set variables per process.
"""

from __future__ import annotations

import os
from pathlib import Path

from worldserve import __version__


def admin_key() -> str | None:
    """WORLDSERVE_ADMIN_KEY: bearer token for /admin routes (unset: loopback clients only)."""
    value = os.environ.get("WORLDSERVE_ADMIN_KEY", "").strip()
    return value or None


def cache_dir() -> Path:
    """WORLDSERVE_CACHE_DIR: root of worldserve's caches (default ~/.cache/worldserve)."""
    raw = os.environ.get("WORLDSERVE_CACHE_DIR")
    return Path(raw).expanduser() if raw else Path.home() / ".cache" / "worldserve"


def dev_models_dir() -> Path:
    """Where `worldserve dev-models build` writes by default: <cache>/dev-models/<version>."""
    raw = os.environ.get("WORLDSERVE_DEV_MODELS_DIR")
    return Path(raw).expanduser() if raw else cache_dir() / "dev-models" / __version__


def run_dir_root() -> Path:
    """WORLDSERVE_RUN_DIR: parent of per-server run folders holding ipc sockets (default /tmp)."""
    return Path(os.environ.get("WORLDSERVE_RUN_DIR", "/tmp"))


def stage_start_timeout_s() -> float | None:
    """WORLDSERVE_STAGE_START_TIMEOUT_S: overrides every stage's start timeout."""
    raw = os.environ.get("WORLDSERVE_STAGE_START_TIMEOUT_S")
    return float(raw) if raw else None


def enable_streaming() -> bool | None:
    """WORLDSERVE_ENABLE_STREAMING: overrides stages.reasoner.streaming.enabled (1/0, true/false)"""
    raw = os.environ.get("WORLDSERVE_ENABLE_STREAMING")
    if raw is None or raw.strip() == "":
        return None
    return raw.strip().lower() in {"1", "true", "yes", "on"}


def torch_num_threads() -> int | None:
    """WORLDSERVE_TORCH_THREADS: intra-op threads for each stage process (default: torch's)."""
    raw = os.environ.get("WORLDSERVE_TORCH_THREADS")
    return int(raw) if raw else None


def server_url() -> str | None:
    """WORLDSERVE_URL: base URL that clients (`worldserve stream`) use (unset: their default)."""
    value = os.environ.get("WORLDSERVE_URL", "").strip()
    return value or None
