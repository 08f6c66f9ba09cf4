"""Client behaviours a real worldserve never shows, against a tiny stand-in server:
flag refusals that never touch the network, the 415 hint, injected WebSocket errors,
pre-flight failures."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.integration.stream_client.conftest import run_client
from tests.integration.stream_client.mini_server import MiniBehaviour, MiniServer
from tests.support.server import free_port


@pytest.fixture
def mini(request: pytest.FixtureRequest) -> Iterator[MiniServer]:
    behaviour = getattr(request, "param", None) or MiniBehaviour()
    with MiniServer(behaviour) as server:
        yield server


@pytest.mark.parametrize(("flags", "message"), [
    (["--fps", "0"], "--fps must be a finite number > 0"),
    (["--fps", "nan"], "--fps must be a finite number > 0"),
    (["--max-frames", "0"], "--max-frames must be >= 1"),
    (["--max-tokens", "0"], "--max-tokens must be >= 1"),
    (["--transport", "websocket", "--backend", "dynamo"], "dynamo supports only --transport rest"),
    (["--transport", "carrier-pigeon"], "--transport must be one of"),
    (["--video", "/nonexistent/clip.mp4"], "video not found: /nonexistent/clip.mp4"),
])
def test_bad_flags_exit_2_without_contacting_the_server(mini: MiniServer, clip: Path,
                                                        flags: list[str], message: str) -> None:
    done = run_client("--url", mini.base_url, "--video", str(clip), *flags)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert mini.state.requests == []


def test_non_http_url_is_refused(clip: Path) -> None:
    done = run_client("--video", str(clip), env={"WORLDSERVE_URL": "ws://127.0.0.1:1"})
    assert done.returncode == 2 and "--url must start with http:// or https://" in done.stderr


@pytest.mark.parametrize("mini", [MiniBehaviour(refuse_raw_frames=True)], indirect=True)
def test_rest_binary_against_a_server_that_refuses_raw_bodies(mini: MiniServer,
                                                              clip: Path) -> None:
    done = run_client("--url", mini.base_url, "--video", str(clip), "--fps", "2",
                      "--transport", "rest", "--frame-format", "binary")
    assert done.returncode == 1
    assert "[error 415]" in done.stderr and "use --frame-format base64" in done.stderr
    assert len(mini.state.deleted) == 1 and mini.state.sessions == {}  # cleaned up after the error
    assert "closed after 0 frames" in done.stdout


@pytest.mark.parametrize("mini", [MiniBehaviour(delete_status=500)], indirect=True)
def test_failed_cleanup_exits_1(mini: MiniServer, clip: Path) -> None:
    done = run_client("--url", mini.base_url, "--video", str(clip), "--fps", "2",
                      "--max-frames", "2", "--transport", "rest")
    assert done.returncode == 1
    assert len([line for line in done.stdout.splitlines() if line.startswith("frame")]) == 2
    assert ("session cleanup failed: HTTP 500: cleanup broke; idle timeout is the backstop"
            in done.stderr)


@pytest.mark.parametrize("mini", [MiniBehaviour(ws_nonfatal_errors_at={1, 3})], indirect=True)
def test_non_fatal_websocket_errors_are_printed_and_the_stream_goes_on(mini: MiniServer,
                                                                       clip: Path) -> None:
    done = run_client("--url", mini.base_url, "--video", str(clip), "--fps", "2")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("[error 413] frame too large") == 2
    assert [line for line in done.stdout.splitlines() if line.startswith("frame")] == [
        f"frame {i:>4}: reply {i}  (0.02s)" for i in range(4)]
    assert "closed after 4 frames" in done.stdout
    assert mini.state.sessions == {}


@pytest.mark.parametrize("mini", [MiniBehaviour(ws_fatal_error_at=2)], indirect=True)
def test_fatal_websocket_error_ends_the_stream(mini: MiniServer, clip: Path) -> None:
    done = run_client("--url", mini.base_url, "--video", str(clip), "--fps", "2")
    assert done.returncode == 1
    assert "[error 500] engine failed" in done.stderr
    assert sum(line.startswith("frame") for line in done.stdout.splitlines()) == 2
    assert mini.state.sessions == {}


@pytest.mark.parametrize("mini", [MiniBehaviour(streaming_status=404),
                                  MiniBehaviour(streaming_status=501)], indirect=True)
@pytest.mark.parametrize("backend", ["standalone", "dynamo"])
def test_streaming_unavailable(mini: MiniServer, clip: Path, backend: str) -> None:
    done = run_client("--url", mini.base_url, "--video", str(clip), "--backend", backend)
    assert done.returncode == 1 and "streaming is unavailable" in done.stderr
    assert mini.state.sessions == {} and not any("sessions" in r for r in mini.state.requests)


@pytest.mark.parametrize("mini", [MiniBehaviour(model_type="generator")], indirect=True)
def test_a_server_that_is_not_a_reasoner_is_refused(mini: MiniServer, clip: Path) -> None:
    done = run_client("--url", mini.base_url, "--video", str(clip))
    assert done.returncode == 1 and "is not a streaming reasoner" in done.stderr
    mini.state.requests.clear()
    dynamo = run_client("--url", mini.base_url, "--video", str(clip), "--backend", "dynamo",
                        "--fps", "2")
    assert dynamo.returncode == 0, dynamo.stderr  # dynamo mode never reads /v1/metadata
    assert mini.state.requests[:3] == ["GET /health", "GET /v1/models",
                                       "GET /v1/streaming/config"]
    assert "GET /v1/metadata" not in mini.state.requests


def test_unreachable_server(clip: Path) -> None:
    done = run_client("--url", f"http://127.0.0.1:{free_port()}", "--video", str(clip))
    assert done.returncode == 1 and "cannot reach" in done.stderr
