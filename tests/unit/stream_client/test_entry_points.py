"""The spec's names for the stream client run the same command as `worldserve stream`."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["worldserve.clients.stream", "worldserve.clients.streaming"])
def test_module_entry_points_refuse_bad_flags_like_the_cli(module: str) -> None:
    done = subprocess.run([sys.executable, "-m", module, "--video", "x.mp4", "--fps", "0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--fps must be a finite number > 0" in done.stderr
