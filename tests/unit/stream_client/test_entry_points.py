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


def test_nim_cookbook_flags_are_accepted() -> None:
    # --nim-url and --backend nim parse; the refusal that follows is the URL check, by its name.
    done = subprocess.run([sys.executable, "-m", "worldserve.clients.stream", "--video", "x.mp4",
                           "--backend", "nim", "--nim-url", "ftp://h"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "--url" in done.stderr and "must be one of" not in done.stderr
