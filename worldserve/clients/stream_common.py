"""Shared pieces of `worldserve stream`: limits, exit codes, errors and the options."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional

JPEG_QUALITY = 85
MAX_FRAME_PIXELS = 4_194_304  # the server refuses larger frames (413); we downscale instead
DEFAULT_SOURCE_FPS = 30.0     # when the container does not say
PREFLIGHT_TIMEOUT_S = 30.0
FRAME_TIMEOUT_S = 1800.0      # a client ceiling, not an expected latency
CLOSE_TIMEOUT_S = 30.0
WS_PATH = "/v1/streaming/ws"
SESSIONS_PATH = "/v1/streaming/sessions"
DEFAULT_QUESTION = "What is happening in this feed?"
DEFAULT_SYSTEM_PROMPT = ("You are monitoring a live video feed. Describe each frame in one short "
                         "sentence and flag anything hazardous.")

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class UsageError(ValueError):
    """A flag value that can never work; reported before contacting the server (exit 2)."""


class StreamError(RuntimeError):
    """Pre-flight, session or frame failure (exit 1)."""


class CleanupError(RuntimeError):
    """The session could not be closed (exit 1; the server's idle timeout is the backstop)."""


@dataclass(frozen=True)
class StreamOptions:
    """Every flag of `worldserve stream`, after defaults are filled in."""

    video: str
    url: str = "http://localhost:8000"
    backend: Literal["standalone", "dynamo"] = "standalone"
    transport: Literal["websocket", "rest"] = "websocket"
    frame_format: Literal["binary", "base64"] = "binary"
    input_format: Optional[str] = None
    fps: float = 1.0
    max_frames: int = 30
    loop: bool = False
    realtime: bool = False
    quiet: bool = False
    json_output: bool = False
    max_tokens: int = 48
    max_video_segments: Optional[int] = None
    question: str = DEFAULT_QUESTION
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    # --api-key or WORLDSERVE_API_KEY (clients/auth.py); kept out of the repr, hence of logs
    api_key: Optional[str] = field(default=None, repr=False)


def validate_options(opts: StreamOptions) -> None:
    """Refuse flag values that cannot work, naming the flag and the rule."""
    if not opts.url.startswith(("http://", "https://")):
        raise UsageError(f"--url must start with http:// or https://, got {opts.url!r}")
    if not (math.isfinite(opts.fps) and opts.fps > 0):
        raise UsageError(f"--fps must be a finite number > 0, got {opts.fps}")
    for flag, value in (("--max-frames", opts.max_frames), ("--max-tokens", opts.max_tokens),
                        ("--max-video-segments", opts.max_video_segments)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    if not opts.system_prompt.strip():
        raise UsageError("--system-prompt must not be empty")
    if opts.backend == "dynamo" and opts.transport != "rest":
        raise UsageError("--backend dynamo supports only --transport rest "
                         "(WebSocket is not available behind Dynamo)")
    if "://" not in opts.video and not Path(opts.video).exists():
        raise UsageError(f"video not found: {opts.video}")
