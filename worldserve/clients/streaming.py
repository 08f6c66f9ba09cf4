"""`worldserve stream`: feed a video to a live reasoning session and print one reply per frame.

The client side of the streaming reasoning contract (spec/streaming-reasoning.md §14): decode a
video (a file, any FFmpeg input such as an RTSP URL, or a V4L2 camera) with PyAV, keep one frame
every `step`, encode it as JPEG and send it over a WebSocket or REST session, waiting for each
reply before sending the next frame. Pieces: options + validation (`stream_common.py`), the
sampler (`frames.py`), the transports (`stream_transports.py`: one interface, two
implementations); here: pre-flight, printer, `run()` and the command.

Imports no torch / transformers / diffusers: it runs on machines that only have a camera.
"""

from __future__ import annotations

import json
import math
import sys
import time
from typing import Any, Iterator, Optional, TextIO

import httpx
import typer

from worldserve import envs
from worldserve.clients.auth import API_KEY_HELP, MISSING_KEY_HINT, bearer_headers, resolve_api_key
from worldserve.clients.frames import (  # noqa: F401  (re-exported)
    encode_jpeg,
    fit_within_pixels,
    iter_frames,
    sample_step,
)
from worldserve.clients.stream_common import (  # noqa: F401  (re-exported)
    DEFAULT_QUESTION,
    DEFAULT_SYSTEM_PROMPT,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    JPEG_QUALITY,
    MAX_FRAME_PIXELS,
    PREFLIGHT_TIMEOUT_S,
    CleanupError,
    StreamError,
    StreamOptions,
    UsageError,
    validate_options,
)
from worldserve.clients.stream_transports import (  # noqa: F401  (re-exported)
    FrameError,
    RestTransport,
    Transport,
    WebSocketTransport,
    make_transport,
    websocket_url,
)

# --- pre-flight ------------------------------------------------------------------------------


def _get_json(client: httpx.Client, path: str) -> tuple[int, Any]:
    try:
        response = client.get(path)
    except httpx.HTTPError as exc:
        raise StreamError(f"cannot reach {client.base_url}{path}: {exc}") from exc
    if response.status_code == 401:
        refused = "the server refused the API key" if "authorization" in client.headers \
            else MISSING_KEY_HINT
        raise StreamError(f"GET {path} answered 401: {refused}")
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, response.text


def _check_streaming_config(client: httpx.Client) -> dict:
    status, body = _get_json(client, "/v1/streaming/config")
    if status in (404, 501):
        raise StreamError(
            f"streaming is unavailable at {client.base_url} "
            f"(GET /v1/streaming/config answered {status})"
        )
    if not 200 <= status < 300:
        raise StreamError(f"GET /v1/streaming/config failed: HTTP {status}: {body}")
    if not isinstance(body, dict) or not isinstance(body.get("model"), str) or not body["model"]:
        raise StreamError(f"/v1/streaming/config has no model: {body}")
    return body


def _check_standalone(client: httpx.Client) -> None:
    status, body = _get_json(client, "/v1/health/ready")
    if not 200 <= status < 300:
        raise StreamError(f"server is not ready: GET /v1/health/ready answered {status}: {body}")
    status, meta = _get_json(client, "/v1/metadata")
    if not 200 <= status < 300 or not isinstance(meta, dict):
        raise StreamError(f"GET /v1/metadata failed: HTTP {status}: {meta}")
    if (
        meta.get("model_type") != "reasoner"
        or meta.get("inference_endpoint") != "/v1/chat/completions"
    ):
        raise StreamError(
            f"{client.base_url} is not a streaming reasoner: model_type "
            f"{meta.get('model_type')!r}, inference_endpoint "
            f"{meta.get('inference_endpoint')!r}"
        )
    profile = meta.get("selectedModelProfileId")
    if not isinstance(profile, str) or not profile:
        raise StreamError(
            "/v1/metadata has no selectedModelProfileId; verify the selected Reasoner profile"
        )


def _check_dynamo(client: httpx.Client) -> list[str]:
    status, body = _get_json(client, "/health")
    if not 200 <= status < 300:
        raise StreamError(f"server is not healthy: GET /health answered {status}: {body}")
    status, models = _get_json(client, "/v1/models")
    data = models.get("data") if isinstance(models, dict) else None
    if not 200 <= status < 300 or not isinstance(data, list) or not data:
        raise StreamError(f"GET /v1/models lists no model: HTTP {status}: {models}")
    return [m.get("id") for m in data if isinstance(m, dict)]


def preflight(opts: StreamOptions, err: TextIO) -> dict:
    """Check that `opts.url` serves streaming reasoning; return its /v1/streaming/config."""
    with httpx.Client(base_url=opts.url, timeout=PREFLIGHT_TIMEOUT_S,
                      headers=bearer_headers(opts.api_key)) as client:
        if opts.backend == "dynamo":
            model_ids = _check_dynamo(client)
            config = _check_streaming_config(client)
            if config["model"] not in model_ids:
                print(
                    f"warning: streaming model {config['model']!r} is not listed by "
                    f"/v1/models ({model_ids})",
                    file=err,
                )
            return config
        _check_standalone(client)
        return _check_streaming_config(client)


def session_body(opts: StreamOptions, model: str) -> dict:
    body: dict[str, Any] = {
        "model": model,
        "system_prompt": opts.system_prompt,
        "question": opts.question,
        "fps": opts.fps,
        "sampling": {"max_tokens": opts.max_tokens},
    }
    if opts.max_video_segments is not None:
        body["retention"] = {"max_video_segments": opts.max_video_segments}
    return body


# --- printer ---------------------------------------------------------------------------------

# C0/C1 control characters (ESC, BEL, CR...) from a reply must not drive the user's terminal.
_CONTROL_TO_ESCAPE = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))}


def printable(text: str) -> str:
    """`text` with control characters shown as \\xNN escapes."""
    return text.translate(_CONTROL_TO_ESCAPE)


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


class Printer:
    """Replies on stdout (text lines or JSON objects); status and errors on stderr."""

    def __init__(self, opts: StreamOptions, out: TextIO, err: TextIO) -> None:
        self.opts, self.out, self.err = opts, out, err
        self.info = err if opts.json_output else out
        self.progress = opts.quiet and err.isatty()
        self.latencies_s: list[float] = []
        self.num_evicted = self.num_reprefills = 0
        self.reports_eviction = False

    def status(self, line: str) -> None:
        print(line, file=self.info, flush=True)

    def created(self, reply: dict) -> None:
        self.status(f"session {reply.get('session_id')} on {reply.get('model')}\n")

    def reply(self, reply: dict, round_trip_s: float) -> None:
        latency_s = reply.get("latency_s")
        self.latencies_s.append(latency_s if latency_s is not None else round_trip_s)
        if "evicted_segments" in reply or "reprefill_ms" in reply:
            self.reports_eviction = True
            self.num_evicted += reply.get("evicted_segments") or 0
            self.num_reprefills += reply.get("reprefill_ms") is not None
        index = reply.get("frame_index", len(self.latencies_s) - 1)
        if self.opts.quiet and index % 10 != 0:
            return
        if self.opts.json_output:
            print(
                json.dumps({k: v for k, v in reply.items() if k != "op"}), file=self.out, flush=True
            )
            return
        timing = f"  ({latency_s:.2f}s)" if latency_s is not None else ""
        self._clear_progress()
        print(
            f"frame {index:>4}: {printable(str(reply.get('text', '')))}{timing}",
            file=self.out,
            flush=True,
        )

    def error(self, error: FrameError | str) -> None:
        self._clear_progress()
        if isinstance(error, FrameError):
            error = f"[error {error.code}] {error.message}" if error.code else error.message
        print(printable(error), file=self.err, flush=True)

    def sent(self, num_sent: int) -> None:
        if self.progress:
            width, total = 30, self.opts.max_frames
            filled = width * num_sent // total
            self.err.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {num_sent}/{total} frames")
            self.err.flush()

    def _clear_progress(self) -> None:
        if self.progress:
            self.err.write("\r\033[K")

    def summary(self) -> None:
        self._clear_progress()
        parts = [f"{len(self.latencies_s)} frames"]
        if self.latencies_s:
            mean_s = sum(self.latencies_s) / len(self.latencies_s)
            parts.append(
                f"mean latency {mean_s:.2f}s, p95 {percentile(self.latencies_s, 0.95):.2f}s"
            )
        if self.reports_eviction:
            parts.append(f"evicted segments {self.num_evicted}, re-prefills {self.num_reprefills}")
        self.status("summary: " + "; ".join(parts))


# --- main ------------------------------------------------------------------------------------


def stream_frames(transport: Transport, frames: Iterator[bytes], printer: Printer) -> None:
    """Send each frame, wait for its reply, print it; a fatal error raises StreamError."""
    for num_sent, jpeg in enumerate(frames, start=1):
        started = time.perf_counter()
        result = transport.send(jpeg)
        printer.sent(num_sent)
        if isinstance(result, FrameError):
            if result.fatal:
                raise StreamError(
                    f"[error {result.code}] {result.message}" if result.code else result.message
                )
            printer.error(result)
            continue
        printer.reply(result, time.perf_counter() - started)


def _close(transport: Transport, printer: Printer, code: int) -> int:
    try:
        frames = transport.close()
    except CleanupError as exc:
        printer.error(f"session cleanup failed: {exc}; idle timeout is the backstop")
        return EXIT_FAILED
    if frames is not None:
        printer.status(f"closed after {frames} frames")
    return code


def run(opts: StreamOptions, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """The whole client; returns the exit code (options are assumed valid)."""
    printer = Printer(opts, out, err)
    transport: Transport | None = None
    code = EXIT_OK
    try:
        config = preflight(opts, err)
        frames = iter_frames(
            opts.video, opts.fps, opts.max_frames, opts.loop, opts.input_format, opts.realtime
        )
        first = next(frames)  # decode errors surface before a session exists
        transport = make_transport(opts)
        if opts.transport == "websocket":
            printer.status(f"connecting to {websocket_url(opts.url)}")
        printer.created(transport.open(session_body(opts, config["model"])))
        stream_frames(transport, _chain(first, frames), printer)
    except StreamError as exc:
        printer.error(str(exc))
        code = EXIT_FAILED
    except KeyboardInterrupt:
        printer.error("interrupted")
        code = EXIT_INTERRUPTED
    finally:
        if transport is not None:
            code = _close(transport, printer, code)
    printer.summary()
    return code


def _chain(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    yield first
    yield from rest


def stream_command(
    video: str = typer.Option(
        ...,
        "--video",
        help="Video file, any FFmpeg input (e.g. an "
        "rtsp:// URL), or a camera device with --input-format v4l2.",
    ),
    url: Optional[str] = typer.Option(
        None,
        "--url",
        "--nim-url",
        help="Server base URL (default: $WORLDSERVE_URL, else $NIM_URL, else "
        "http://localhost:8000). --nim-url is the NIM cookbook's name.",
    ),
    transport: Optional[str] = typer.Option(
        None,
        "--transport",
        help="websocket | rest (default: websocket; rest with --backend dynamo).",
    ),
    backend: str = typer.Option(
        "standalone",
        "--backend",
        help="standalone (alias: nim) | dynamo (selects the pre-flight; dynamo is REST only).",
    ),
    frame_format: Optional[str] = typer.Option(
        None,
        "--frame-format",
        help="binary | base64 (default: binary for websocket, base64 for rest).",
    ),
    input_format: Optional[str] = typer.Option(
        None, "--input-format", help="FFmpeg input format, e.g. v4l2."
    ),
    fps: float = typer.Option(1.0, "--fps", help="Sampling rate in frames per second (> 0)."),
    max_frames: int = typer.Option(30, "--max-frames", help="Stop after this many frames."),
    loop: bool = typer.Option(False, "--loop", help="Replay the video until --max-frames."),
    realtime: bool = typer.Option(False, "--realtime", help="Pace frames in wall-clock time."),
    quiet: bool = typer.Option(False, "--quiet", help="Print every tenth reply only."),
    json_output: bool = typer.Option(False, "--json", help="One JSON object per reply."),
    max_tokens: int = typer.Option(48, "--max-tokens", help="Reply length bound per frame."),
    max_video_segments: Optional[int] = typer.Option(
        None, "--max-video-segments", help="Retained frame window."
    ),
    question: str = typer.Option(DEFAULT_QUESTION, "--question", help="Sent with frame 0."),
    system_prompt: str = typer.Option(DEFAULT_SYSTEM_PROMPT, "--system-prompt"),
    api_key: Optional[str] = typer.Option(None, "--api-key", help=API_KEY_HELP),
) -> None:
    """Stream a video to a live reasoning session; print one reply per sampled frame."""
    try:
        opts = build_options(locals())
        validate_options(opts)
    except UsageError as exc:
        typer.echo(f"worldserve stream: error: {exc}", err=True)
        raise typer.Exit(code=EXIT_USAGE)
    try:
        code = run(opts)
    except KeyboardInterrupt:  # a second Ctrl+C during cleanup
        code = EXIT_INTERRUPTED
    raise typer.Exit(code=code)


# The NIM cookbook's `--backend nim` is worldserve's standalone pre-flight.
BACKEND_ALIASES = {"nim": "standalone"}
DEFAULT_URL = "http://localhost:8000"


def build_options(flags: dict[str, Any]) -> StreamOptions:
    """Fill in the defaults that depend on other flags; check the choice flags."""
    choices = {
        "transport": ("websocket", "rest"),
        "backend": ("standalone", "nim", "dynamo"),
        "frame_format": ("binary", "base64"),
    }
    for name, allowed in choices.items():
        if flags[name] is not None and flags[name] not in allowed:
            raise UsageError(
                f"--{name.replace('_', '-')} must be one of "
                f"{', '.join(allowed)}, got {flags[name]!r}"
            )
    backend = BACKEND_ALIASES.get(flags["backend"], flags["backend"])
    transport = flags["transport"] or ("rest" if backend == "dynamo" else "websocket")
    frame_format = flags["frame_format"] or ("binary" if transport == "websocket" else "base64")
    url = (flags["url"] or envs.server_url() or envs.nim_url() or DEFAULT_URL).rstrip("/")
    return StreamOptions(**{**flags, "url": url, "backend": backend, "transport": transport,
                            "frame_format": frame_format,
                            "api_key": resolve_api_key(flags["api_key"])})


def main() -> None:
    typer.run(stream_command)


if __name__ == "__main__":
    main()
