"""Flag defaults and refusals, session body, and the printer's lines and summary."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest

from worldserve.clients.streaming import (
    FrameError,
    Printer,
    StreamOptions,
    UsageError,
    build_options,
    percentile,
    session_body,
    validate_options,
    websocket_url,
)

FLAGS = dict(video="clip.mp4", url=None, transport=None, backend="standalone", frame_format=None,
             input_format=None, fps=1.0, max_frames=30, loop=False, realtime=False, quiet=False,
             json_output=False, max_tokens=48, max_video_segments=None, question="q",
             system_prompt="s", api_key=None)


def options(**changes) -> StreamOptions:
    return build_options({**FLAGS, **changes})


def test_defaults_follow_transport_and_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLDSERVE_URL", raising=False)
    monkeypatch.delenv("NIM_URL", raising=False)
    opts = options()
    assert (opts.url, opts.transport, opts.frame_format) == ("http://localhost:8000", "websocket",
                                                             "binary")
    assert options(transport="rest").frame_format == "base64"
    assert options(backend="dynamo").transport == "rest"
    assert options(transport="rest", frame_format="binary").frame_format == "binary"


def test_url_comes_from_flag_then_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLDSERVE_URL", "https://reasoner.example:9000/base/")
    assert options().url == "https://reasoner.example:9000/base"
    assert options(url="http://127.0.0.1:1234").url == "http://127.0.0.1:1234"


def test_api_key_comes_from_flag_then_environment_and_stays_out_of_repr(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLDSERVE_API_KEY", raising=False)
    assert options().api_key is None
    monkeypatch.setenv("WORLDSERVE_API_KEY", "from-env")
    assert options().api_key == "from-env"
    assert options(api_key="from-flag").api_key == "from-flag"
    assert "from-flag" not in repr(options(api_key="from-flag"))


def test_nim_url_is_the_fallback_after_worldserve_url(monkeypatch: pytest.MonkeyPatch) -> None:
    # The NIM cookbook's $NIM_URL: used when neither a flag nor $WORLDSERVE_URL is given.
    monkeypatch.delenv("WORLDSERVE_URL", raising=False)
    monkeypatch.setenv("NIM_URL", "http://nim.example:8000/")
    assert options().url == "http://nim.example:8000"
    assert options(url="http://127.0.0.1:1234").url == "http://127.0.0.1:1234"
    monkeypatch.setenv("WORLDSERVE_URL", "http://ws.example")
    assert options().url == "http://ws.example"


def test_backend_nim_is_the_standalone_preflight() -> None:
    opts = options(backend="nim")
    assert (opts.backend, opts.transport, opts.frame_format) == ("standalone", "websocket",
                                                                 "binary")


def test_websocket_url_keeps_host_and_base_path() -> None:
    assert websocket_url("http://h:1/base") == "ws://h:1/base/v1/streaming/ws"
    assert websocket_url("https://h") == "wss://h/v1/streaming/ws"


@pytest.mark.parametrize(("changes", "message"), [
    ({"fps": 0.0}, "--fps"), ({"fps": -1.0}, "--fps"), ({"fps": math.nan}, "--fps"),
    ({"fps": math.inf}, "--fps"), ({"max_frames": 0}, "--max-frames"),
    ({"max_tokens": 0}, "--max-tokens"), ({"max_video_segments": 0}, "--max-video-segments"),
    ({"url": "ftp://h"}, "--url"), ({"url": "localhost:8000"}, "--url"),
    ({"video": "missing.mp4"}, "video not found"), ({"system_prompt": "  "}, "--system-prompt"),
    ({"backend": "dynamo", "transport": "websocket"}, "dynamo"),
])
def test_refusals(tmp_path: Path, changes: dict, message: str) -> None:
    video = tmp_path / "clip.mp4"
    video.write_bytes(b"x")
    opts = options(**{"video": str(video), **changes})
    with pytest.raises(UsageError, match=message):
        validate_options(opts)


@pytest.mark.parametrize("changes", [{"transport": "udp"}, {"backend": "sglang"},
                                     {"frame_format": "png"}])
def test_unknown_choices_are_refused(changes: dict) -> None:
    with pytest.raises(UsageError, match="must be one of"):
        options(**changes)


def test_valid_options_and_urls_that_are_not_files_pass(tmp_path: Path) -> None:
    validate_options(options(video="rtsp://camera.local/stream"))
    video = tmp_path / "clip.mp4"
    video.write_bytes(b"x")
    validate_options(options(video=str(video), transport="rest", frame_format="binary"))


def test_session_body() -> None:
    body = session_body(options(fps=2.0, max_tokens=7), "m")
    assert body == {"model": "m", "system_prompt": "s", "question": "q", "fps": 2.0,
                    "sampling": {"max_tokens": 7}}
    assert session_body(options(max_video_segments=4), "m")["retention"] == {
        "max_video_segments": 4}


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def reply(index: int, latency_s: float | None = 0.5, **extra) -> dict:
    return {"op": "frame", "frame_index": index, "text": f"t{index}", "latency_s": latency_s,
            **extra}


def test_lines_and_summary() -> None:
    out, err = io.StringIO(), io.StringIO()
    printer = Printer(options(), out, err)
    printer.reply(reply(0, 1.0), 9.0)
    printer.reply(reply(1, None), 3.0)  # no server latency: the round trip is used
    printer.error(FrameError(413, "frame too large", fatal=False))
    printer.summary()
    lines = out.getvalue().splitlines()
    assert lines[0] == "frame    0: t0  (1.00s)"
    assert lines[1] == "frame    1: t1"
    assert lines[2] == "summary: 2 frames; mean latency 2.00s, p95 3.00s"
    assert err.getvalue() == "[error 413] frame too large\n"


def test_summary_counts_evictions_and_reprefills() -> None:
    out = io.StringIO()
    printer = Printer(options(), out, io.StringIO())
    printer.reply(reply(0, evicted_segments=0, reprefill_ms=None), 0.1)
    printer.reply(reply(1, evicted_segments=2, reprefill_ms=None), 0.1)
    printer.reply(reply(2, evicted_segments=1, reprefill_ms=12.5), 0.1)
    printer.summary()
    assert out.getvalue().splitlines()[-1].endswith("evicted segments 3, re-prefills 1")


def test_quiet_prints_every_tenth_reply_and_a_progress_bar_on_a_tty() -> None:
    out, err = io.StringIO(), Tty()
    printer = Printer(options(quiet=True, max_frames=25), out, err)
    for index in range(25):
        printer.sent(index + 1)
        printer.reply(reply(index), 0.1)
    assert [line.split(":")[0] for line in out.getvalue().splitlines()] == [
        "frame    0", "frame   10", "frame   20"]
    assert "25/25 frames" in err.getvalue() and "[" + "#" * 30 + "]" in err.getvalue()
    quiet_no_tty = io.StringIO()
    Printer(options(quiet=True), io.StringIO(), quiet_no_tty).sent(1)
    assert quiet_no_tty.getvalue() == ""


def test_json_mode_keeps_stdout_for_replies() -> None:
    out, err = io.StringIO(), io.StringIO()
    printer = Printer(options(json_output=True), out, err)
    printer.created({"session_id": "sess-1", "model": "m"})
    printer.reply(reply(0, evicted_segments=0), 0.1)
    printer.summary()
    (line,) = out.getvalue().splitlines()
    assert json.loads(line) == {"frame_index": 0, "text": "t0", "latency_s": 0.5,
                                "evicted_segments": 0}
    assert "session sess-1 on m" in err.getvalue() and "summary: 1 frames" in err.getvalue()


def test_percentile_nearest_rank() -> None:
    assert percentile([1.0], 0.95) == 1.0
    assert percentile([float(i) for i in range(1, 21)], 0.95) == 19.0
    assert percentile([float(i) for i in range(1, 101)], 0.95) == 95.0


def test_control_characters_in_replies_cannot_drive_the_terminal() -> None:
    out = io.StringIO()
    Printer(options(), out, io.StringIO()).reply(
        {"frame_index": 0, "text": "a\x1b[2Jb\x07c\nd\u00e9", "latency_s": None}, 0.1)
    assert out.getvalue() == "frame    0: a\\x1b[2Jb\\x07c\\x0ad\u00e9\n"
