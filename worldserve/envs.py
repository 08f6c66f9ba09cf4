"""Every environment variable worldserve reads (WORLDSERVE_*, the NIM aliases, NIM_URL,
CUDA_VISIBLE_DEVICES), read here and nowhere else.

Each accessor reads the environment when called, so tests can set variables per process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from worldserve import __version__


def admin_key() -> str | None:
    """WORLDSERVE_ADMIN_KEY: bearer token for /admin routes (unset: loopback clients only)."""
    value = os.environ.get("WORLDSERVE_ADMIN_KEY", "").strip()
    return value or None


def api_key() -> str | None:
    """WORLDSERVE_API_KEY: the bearer key of every inference route, as `--api-key` (unset and no
    flag: the inference routes are open)."""
    value = os.environ.get("WORLDSERVE_API_KEY", "").strip()
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


def torch_num_threads() -> int | None:
    """WORLDSERVE_TORCH_THREADS: intra-op threads for each stage process (default: torch's)."""
    raw = os.environ.get("WORLDSERVE_TORCH_THREADS")
    return int(raw) if raw else None


def server_url() -> str | None:
    """WORLDSERVE_URL: base URL that clients (`worldserve stream`) use (unset: their default)."""
    value = os.environ.get("WORLDSERVE_URL", "").strip()
    return value or None


def nim_url() -> str | None:
    """NIM_URL: the NIM cookbook's base URL for the stream client (after WORLDSERVE_URL)."""
    value = os.environ.get("NIM_URL", "").strip()
    return value or None


def tracemalloc_dir() -> Path | None:
    """WORLDSERVE_TRACEMALLOC_DIR: a folder where the api process writes tracemalloc snapshots
    and its top allocation growth (api/memtrace.py), to find what grows in a soak. Unset (the
    default): tracemalloc stays off; it slows every allocation down."""
    raw = os.environ.get("WORLDSERVE_TRACEMALLOC_DIR", "").strip()
    return Path(raw).expanduser() if raw else None


def tracemalloc_every_s() -> float:
    """WORLDSERVE_TRACEMALLOC_EVERY_S: seconds between the api's tracemalloc snapshots
    (default 60)."""
    raw = os.environ.get("WORLDSERVE_TRACEMALLOC_EVERY_S", "").strip()
    return float(raw) if raw else 60.0


def cuda_visible_devices() -> list[str] | None:
    """CUDA_VISIBLE_DEVICES of this process, as a list (None: unset, every GPU is visible).
    The placement plan's GPU indices count within it; stage processes get a subset."""
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    return [item.strip() for item in raw.split(",") if item.strip()]


class EnvSettingError(ValueError):
    """A malformed environment variable; the message names it."""


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
DEFAULT_SPEC_NUM_TOKENS = 3


def _parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE | _FALSE:
        return value in _TRUE
    raise ValueError("expected true or false (also 1/0, yes/no, on/off)")


def _parse_int(raw: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError("expected an integer") from None


def _parse_float(raw: str) -> float:
    try:
        return float(raw.strip())
    except ValueError:
        raise ValueError("expected a number") from None


def _parse_word(raw: str) -> str:
    return raw.strip().lower()


def _parse_spec_num_tokens(raw: str) -> int:
    """The NIM's own rule (spec streaming-reasoning section 2): values < 1 become 1, a
    non-integer falls back to 3."""
    try:
        return max(1, int(raw.strip()))
    except ValueError:
        return DEFAULT_SPEC_NUM_TOKENS


@dataclass(frozen=True)
class EnvSetting:
    """One environment variable that sets one config key (dotted path)."""

    variable: str
    path: str
    parse: Callable[[str], Any]


_STREAMING = "stages.reasoner.streaming"
DEVICE_STAGES = ("generation", "reasoner", "realtime")
# The NIM variables of spec streaming-reasoning.md section 2, then worldserve's own (which win
# over a NIM alias of the same key). Precedence overall: flag > environment > YAML > default.
ENV_SETTINGS: tuple[EnvSetting, ...] = (
    EnvSetting("NIM_ENABLE_STREAMING", f"{_STREAMING}.enabled", _parse_bool),
    EnvSetting("NIM_STREAMING_MAX_SESSIONS", f"{_STREAMING}.max_sessions", _parse_int),
    EnvSetting("NIM_STREAMING_MAX_VIDEO_SEGMENTS", f"{_STREAMING}.max_video_segments",
               _parse_int),
    EnvSetting("NIM_STREAMING_IDLE_TIMEOUT_S", f"{_STREAMING}.idle_timeout_s", _parse_float),
    EnvSetting("NIM_STREAMING_REST_IDLE_TIMEOUT_S", f"{_STREAMING}.rest_idle_timeout_s",
               _parse_float),
    EnvSetting("NIM_MAX_IMAGES_PER_PROMPT", f"{_STREAMING}.image_budget", _parse_int),
    EnvSetting("NIM_STREAMING_SPEC_METHOD", f"{_STREAMING}.spec_method", _parse_word),
    EnvSetting("NIM_STREAMING_SPEC_NUM_TOKENS", f"{_STREAMING}.spec_num_tokens",
               _parse_spec_num_tokens),
    EnvSetting("NIM_GUIDED_DECODING_BACKEND", "stages.reasoner.guided_decoding_backend",
               _parse_word),
    EnvSetting("NIM_MODEL_TYPE", "nim_runtime", _parse_word),
    EnvSetting("WORLDSERVE_ENABLE_STREAMING", f"{_STREAMING}.enabled", _parse_bool),
    # --device / --dtype of every stage (a YAML stage setting is overridden by these).
    *(EnvSetting("WORLDSERVE_DEVICE", f"stages.{stage}.device", _parse_word)
      for stage in DEVICE_STAGES),
    *(EnvSetting("WORLDSERVE_DTYPE", f"stages.{stage}.dtype", _parse_word)
      for stage in DEVICE_STAGES),
)


def config_settings() -> dict[str, tuple[Any, str]]:
    """Config keys set by the environment: dotted path -> (value, variable name).

    Unset or empty variables are skipped; a malformed one raises EnvSettingError naming it."""
    out: dict[str, tuple[Any, str]] = {}
    for setting in ENV_SETTINGS:
        raw = os.environ.get(setting.variable)
        if raw is None or raw.strip() == "":
            continue
        try:
            out[setting.path] = (setting.parse(raw), setting.variable)
        except ValueError as exc:
            raise EnvSettingError(f"{setting.variable}={raw!r}: {exc}") from None
    return out
