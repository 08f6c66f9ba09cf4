"""`worldserve stream`: feed a video to a live reasoning session and print one reply per frame.

The client side of the streaming reasoning contract (spec/streaming-reasoning.md §14): decode a
video (a file, any FFmpeg input such as an RTSP URL, or a V4L2 camera) with PyAV, keep one frame
every `step`, encode it as JPEG and send it over a WebSocket or REST session, waiting for each
reply before sending the next frame. Pieces: options + validation, sampler, pre-flight,
transports (one interface, two implementations), printer, `run()`.

Imports no torch / transformers / diffusers: it runs on machines that only have a camera.
"""

from __future__ import annotations

import base64
import io
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal, Optional, Protocol, TextIO

import av
import httpx
import typer
from PIL import Image
from websockets.exceptions import ConnectionClosed, WebSocketException
from websockets.sync.client import ClientConnection, connect

from worldserve import envs

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


# --- sampler: PyAV -> JPEG bytes ------------------------------------------------------------

def sample_step(source_fps: float | None, fps: float) -> int:
    """Keep every `step`-th decoded frame: max(1, round(source_fps / fps)), halves to even."""
    rate = source_fps if source_fps and source_fps > 0 else DEFAULT_SOURCE_FPS
    return max(1, round(rate / fps))


def fit_within_pixels(image: Image.Image, max_pixels: int = MAX_FRAME_PIXELS) -> Image.Image:
    """Downscale (aspect ratio kept) so that width × height <= max_pixels."""
    width, height = image.size
    if width * height <= max_pixels:
        return image
    scale = math.sqrt(max_pixels / (width * height))
    new_w, new_h = max(1, int(width * scale)), max(1, int(height * scale))
    while new_w * new_h > max_pixels:  # int() rounding can still overshoot by a row
        new_h -= 1
    return image.resize((new_w, new_h), Image.Resampling.BILINEAR)


def encode_jpeg(image: Image.Image, quality: int = JPEG_QUALITY) -> bytes:
    buf = io.BytesIO()
    fit_within_pixels(image.convert("RGB")).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def _one_pass(video: str, fps: float, input_format: str | None) -> Iterator[tuple[bytes, float]]:
    """One decode of the source: (jpeg, seconds between kept frames) for every kept frame."""
    with av.open(video, format=input_format) as container:
        stream = container.streams.video[0]
        source_fps = float(stream.average_rate) if stream.average_rate else None
        step = sample_step(source_fps, fps)
        interval_s = step / (source_fps or DEFAULT_SOURCE_FPS)
        for index, frame in enumerate(container.decode(stream)):
            if index % step == 0:
                yield encode_jpeg(frame.to_image()), interval_s


def iter_frames(video: str, fps: float, max_frames: int, loop: bool = False,
                input_format: str | None = None, realtime: bool = False) -> Iterator[bytes]:
    """JPEG frames sampled at `fps`, at most `max_frames`; `loop` replays the source.

    Without `realtime` frames come as fast as they decode (the caller waits for each reply);
    with it, kept frames are spaced by their source interval in wall-clock time.
    """
    count, next_at = 0, time.monotonic()
    while count < max_frames:
        produced = 0
        try:
            for jpeg, interval_s in _one_pass(video, fps, input_format):
                if realtime:
                    time.sleep(max(0.0, next_at - time.monotonic()))
                    next_at = max(next_at, time.monotonic() - interval_s) + interval_s
                produced += 1
                count += 1
                yield jpeg
                if count >= max_frames:
                    return
        except (av.FFmpegError, IndexError) as exc:
            raise StreamError(f"cannot decode {video}: {exc}") from exc
        if produced == 0:
            raise StreamError(f"No frames decoded from {video}")
        if not loop:
            return


# --- pre-flight ------------------------------------------------------------------------------

def _get_json(client: httpx.Client, path: str) -> tuple[int, Any]:
    try:
        response = client.get(path)
    except httpx.HTTPError as exc:
        raise StreamError(f"cannot reach {client.base_url}{path}: {exc}") from exc
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, response.text


def _check_streaming_config(client: httpx.Client) -> dict:
    status, body = _get_json(client, "/v1/streaming/config")
    if status in (404, 501):
        raise StreamError(f"streaming is unavailable at {client.base_url} "
                          f"(GET /v1/streaming/config answered {status})")
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
    if (meta.get("model_type") != "reasoner"
            or meta.get("inference_endpoint") != "/v1/chat/completions"):
        raise StreamError(f"{client.base_url} is not a streaming reasoner: model_type "
                          f"{meta.get('model_type')!r}, inference_endpoint "
                          f"{meta.get('inference_endpoint')!r}")
    profile = meta.get("selectedModelProfileId")
    if not isinstance(profile, str) or not profile:
        raise StreamError("/v1/metadata has no selectedModelProfileId; "
                          "verify the selected Reasoner profile")


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
    with httpx.Client(base_url=opts.url, timeout=PREFLIGHT_TIMEOUT_S) as client:
        if opts.backend == "dynamo":
            model_ids = _check_dynamo(client)
            config = _check_streaming_config(client)
            if config["model"] not in model_ids:
                print(f"warning: streaming model {config['model']!r} is not listed by "
                      f"/v1/models ({model_ids})", file=err)
            return config
        _check_standalone(client)
        return _check_streaming_config(client)


def session_body(opts: StreamOptions, model: str) -> dict:
    body: dict[str, Any] = {"model": model, "system_prompt": opts.system_prompt,
                            "question": opts.question, "fps": opts.fps,
                            "sampling": {"max_tokens": opts.max_tokens}}
    if opts.max_video_segments is not None:
        body["retention"] = {"max_video_segments": opts.max_video_segments}
    return body


# --- transports ------------------------------------------------------------------------------

@dataclass(frozen=True)
class FrameError:
    """A failed frame: `fatal` ends the stream."""

    code: int | None
    message: str
    fatal: bool


class Transport(Protocol):
    """One session over one transport: open → send* → close (close is always called)."""

    def open(self, body: dict) -> dict: ...

    def send(self, jpeg: bytes) -> dict | FrameError: ...

    def close(self) -> int | None: ...


def websocket_url(base_url: str) -> str:
    scheme, rest = base_url.split("://", 1)
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest}{WS_PATH}"


class WebSocketTransport:
    """One connection owns one session (spec §8)."""

    def __init__(self, base_url: str, frame_format: str) -> None:
        self.url = websocket_url(base_url)
        self.frame_format = frame_format
        self.ws: ClientConnection | None = None

    def open(self, body: dict) -> dict:
        try:
            self.ws = connect(self.url, max_size=None, open_timeout=PREFLIGHT_TIMEOUT_S)
            self.ws.send(json.dumps({"op": "create", "frame_format": self.frame_format, **body}))
            reply = json.loads(self.ws.recv(timeout=PREFLIGHT_TIMEOUT_S))
        except (OSError, WebSocketException, TimeoutError, ValueError) as exc:
            raise StreamError(f"session create failed: {exc}") from exc
        if not isinstance(reply, dict) or reply.get("op") != "created":
            raise StreamError(f"session create failed: {reply}")
        return reply

    def send(self, jpeg: bytes) -> dict | FrameError:
        assert self.ws is not None, "open() first"
        try:
            if self.frame_format == "binary":
                self.ws.send(jpeg)
            else:
                self.ws.send(json.dumps({"op": "frame",
                                         "image_b64": base64.b64encode(jpeg).decode()}))
            reply = json.loads(self.ws.recv(timeout=FRAME_TIMEOUT_S))
        except (OSError, WebSocketException, TimeoutError, ValueError) as exc:
            return FrameError(None, f"connection lost: {exc}", fatal=True)
        if reply.get("op") == "error":
            return FrameError(reply.get("code"), str(reply.get("message")),
                              bool(reply.get("fatal", True)))
        return reply

    def close(self) -> int | None:
        """Send delete and wait for `closed`; a connection the server already closed is done."""
        if self.ws is None:
            return None
        try:
            self.ws.send(json.dumps({"op": "delete"}))
            deadline = time.monotonic() + CLOSE_TIMEOUT_S
            while True:  # a reply to a frame in flight at Ctrl+C may come first
                reply = json.loads(self.ws.recv(timeout=max(0.0, deadline - time.monotonic())))
                if reply.get("op") == "closed":
                    return reply.get("frames")
        except ConnectionClosed:
            return None  # the server released the session when it closed the connection
        except (OSError, WebSocketException, TimeoutError, ValueError) as exc:
            raise CleanupError(f"no 'closed' reply: {exc}") from exc
        finally:
            self.ws.close()  # dropping the connection also releases the session server-side


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and "message" in error:
        return str(error["message"])
    return str(error if error is not None else body)


class RestTransport:
    """Sessions over REST: create, POST one frame at a time, DELETE (spec §4, §5, §7)."""

    def __init__(self, base_url: str, frame_format: str) -> None:
        self.client = httpx.Client(base_url=base_url, timeout=PREFLIGHT_TIMEOUT_S)
        self.frame_format = frame_format
        self.session_id: str | None = None

    def open(self, body: dict) -> dict:
        try:
            response = self.client.post(SESSIONS_PATH, json=body)
        except httpx.HTTPError as exc:
            raise StreamError(f"session create failed: {exc}") from exc
        if not response.is_success:
            raise StreamError(f"HTTP {response.status_code}: {response.text}")
        reply = response.json()
        self.session_id = reply["session_id"]
        return reply

    def send(self, jpeg: bytes) -> dict | FrameError:
        path = f"{SESSIONS_PATH}/{self.session_id}/frame"
        try:
            if self.frame_format == "binary":
                response = self.client.post(path, content=jpeg, timeout=FRAME_TIMEOUT_S,
                                            headers={"Content-Type": "image/jpeg"})
            else:
                response = self.client.post(path, timeout=FRAME_TIMEOUT_S,
                                            json={"image_b64": base64.b64encode(jpeg).decode()})
        except httpx.HTTPError as exc:
            return FrameError(None, f"frame request failed: {exc}", fatal=True)
        if response.is_success:
            return response.json()
        message = _error_message(response)
        if response.status_code == 415 and self.frame_format == "binary":
            message += ("; this server refuses raw image bodies over REST: "
                        "use --frame-format base64")
        return FrameError(response.status_code, message, fatal=True)  # frames are never retried

    def close(self) -> int | None:
        try:
            if self.session_id is None:
                return None
            try:
                response = self.client.delete(f"{SESSIONS_PATH}/{self.session_id}")
            except httpx.HTTPError as exc:
                raise CleanupError(str(exc)) from exc
            if response.status_code == 404:
                return None  # already gone
            if not response.is_success:
                raise CleanupError(f"HTTP {response.status_code}: {_error_message(response)}")
            return response.json().get("frames")
        finally:
            self.client.close()


def make_transport(opts: StreamOptions) -> Transport:
    if opts.transport == "rest":
        return RestTransport(opts.url, opts.frame_format)
    return WebSocketTransport(opts.url, opts.frame_format)


# --- printer ---------------------------------------------------------------------------------

# C0/C1 control characters (ESC, BEL, CR...) from a reply must not drive the user's terminal.
_CONTROL_TO_ESCAPE = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7f, 0xa0))}


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
            print(json.dumps({k: v for k, v in reply.items() if k != "op"}), file=self.out,
                  flush=True)
            return
        timing = f"  ({latency_s:.2f}s)" if latency_s is not None else ""
        self._clear_progress()
        print(f"frame {index:>4}: {printable(str(reply.get('text', '')))}{timing}", file=self.out, flush=True)

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
            parts.append(f"mean latency {mean_s:.2f}s, "
                         f"p95 {percentile(self.latencies_s, 0.95):.2f}s")
        if self.reports_eviction:
            parts.append(f"evicted segments {self.num_evicted}, "
                         f"re-prefills {self.num_reprefills}")
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
                raise StreamError(f"[error {result.code}] {result.message}"
                                  if result.code else result.message)
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
        frames = iter_frames(opts.video, opts.fps, opts.max_frames, opts.loop,
                             opts.input_format, opts.realtime)
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
    video: str = typer.Option(..., "--video", help="Video file, any FFmpeg input (e.g. an "
                              "rtsp:// URL), or a camera device with --input-format v4l2."),
    url: Optional[str] = typer.Option(None, "--url", help="Server base URL (default: "
                                      "$WORLDSERVE_URL, else http://localhost:8000)."),
    transport: Optional[str] = typer.Option(None, "--transport", help="websocket | rest "
                                            "(default: websocket; rest with --backend dynamo)."),
    backend: str = typer.Option("standalone", "--backend", help="standalone | dynamo "
                                "(selects the pre-flight; dynamo is REST only)."),
    frame_format: Optional[str] = typer.Option(None, "--frame-format", help="binary | base64 "
                                               "(default: binary for websocket, base64 for rest)."),
    input_format: Optional[str] = typer.Option(None, "--input-format",
                                               help="FFmpeg input format, e.g. v4l2."),
    fps: float = typer.Option(1.0, "--fps", help="Sampling rate in frames per second (> 0)."),
    max_frames: int = typer.Option(30, "--max-frames", help="Stop after this many frames."),
    loop: bool = typer.Option(False, "--loop", help="Replay the video until --max-frames."),
    realtime: bool = typer.Option(False, "--realtime", help="Pace frames in wall-clock time."),
    quiet: bool = typer.Option(False, "--quiet", help="Print every tenth reply only."),
    json_output: bool = typer.Option(False, "--json", help="One JSON object per reply."),
    max_tokens: int = typer.Option(48, "--max-tokens", help="Reply length bound per frame."),
    max_video_segments: Optional[int] = typer.Option(None, "--max-video-segments",
                                                     help="Retained frame window."),
    question: str = typer.Option(DEFAULT_QUESTION, "--question", help="Sent with frame 0."),
    system_prompt: str = typer.Option(DEFAULT_SYSTEM_PROMPT, "--system-prompt"),
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


def build_options(flags: dict[str, Any]) -> StreamOptions:
    """Fill in the defaults that depend on other flags; check the choice flags."""
    choices = {"transport": ("websocket", "rest"), "backend": ("standalone", "dynamo"),
               "frame_format": ("binary", "base64")}
    for name, allowed in choices.items():
        if flags[name] is not None and flags[name] not in allowed:
            raise UsageError(f"--{name.replace('_', '-')} must be one of "
                             f"{', '.join(allowed)}, got {flags[name]!r}")
    transport = flags["transport"] or ("rest" if flags["backend"] == "dynamo" else "websocket")
    frame_format = flags["frame_format"] or ("binary" if transport == "websocket" else "base64")
    url = (flags["url"] or envs.server_url() or "http://localhost:8000").rstrip("/")
    return StreamOptions(**{**flags, "url": url, "transport": transport,
                            "frame_format": frame_format})


def main() -> None:
    typer.run(stream_command)


if __name__ == "__main__":
    main()
