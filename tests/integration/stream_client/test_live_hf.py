"""One run of `worldserve stream` against the real `hf` reasoner on the dev checkpoint."""

from __future__ import annotations

from pathlib import Path

from tests.integration.stream_client.conftest import run_client


def test_websocket_stream_on_the_hf_reasoner(server_factory, clip: Path) -> None:
    server = server_factory({"stages": {"generation": {"enabled": False}}})
    done = run_client("--url", server.base_url, "--video", str(clip), "--fps", "2",
                      "--max-frames", "4", "--loop", "--max-tokens", "4", timeout_s=240)
    assert done.returncode == 0, done.stderr + server.log()[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("frame ")]
    assert [line[:11] for line in lines] == [f"frame {i:>4}:" for i in range(4)]
    assert "closed after 4 frames" in done.stdout
    assert done.stdout.splitlines()[-1].startswith("summary: 4 frames; mean latency ")
