"""`worldserve realtime` end to end: decode every encoding, write a playable MP4, exit codes."""

from __future__ import annotations

import subprocess
import sys

import av
import numpy as np
import pytest

from tests.support.server import REPO_ROOT, base_env


def run_client(server, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "worldserve", "realtime", "--url", server.ws_url, *args]
    return subprocess.run(cmd, cwd=REPO_ROOT, env=base_env(), capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("encoding", ["delta-zstd", "jpeg"])
def test_client_writes_decodable_mp4(rt_server, tmp_path, encoding):
    out = tmp_path / "world.mp4"
    done = run_client(rt_server, "--prompt", "a harbour", "--actions", "d-6,w-6",
                      "--max-chunks", "2", "--encoding", encoding, "--size", "64x48",
                      "--seed", "7", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("chunk 0: 12 frames") and lines[1].startswith("chunk 1: 12 frames")
    assert "closed 1000 'generation complete': 2 chunks, 24 frames" in done.stdout
    with av.open(str(out)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(frames) == 24 and frames[0].shape == (48, 64, 3)
    # the fake world's red channel moves with the camera: frames differ
    assert not np.array_equal(frames[0], frames[-1])


def test_client_exit_codes(rt_server, tmp_path):
    refused = run_client(rt_server, "--prompt", "p", "--size", "65x48", "--max-chunks", "1")
    assert refused.returncode == 2 and "invalid generate request" in refused.stdout
    usage = run_client(rt_server, "--prompt", "p", "--encoding", "gif")
    assert usage.returncode == 2 and "--encoding" in usage.stderr
    down = subprocess.run([sys.executable, "-m", "worldserve", "realtime", "--url",
                           "ws://127.0.0.1:9", "--prompt", "p"], cwd=REPO_ROOT, env=base_env(),
                          capture_output=True, text=True, timeout=60)
    assert down.returncode == 1 and "cannot connect" in down.stdout
