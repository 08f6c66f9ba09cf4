"""Run folders of a server that was SIGKILLed (it cannot remove its own) are removed by the next
server on the same port; the fault soak found one left per api kill (issue 34)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from worldserve.runtime.run_dirs import OWNER_FILE, make_run_dir


def _folder(root: Path, name: str, owner: int | None) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "generation.sock").write_text("")
    if owner is not None:
        (folder / OWNER_FILE).write_text(str(owner))
    return folder


def test_only_folders_of_a_dead_owner_on_the_same_port_are_removed(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid is free now (reaped)
    dead = _folder(tmp_path, "worldserve-8000-dead", gone.pid)
    living = _folder(tmp_path, "worldserve-8000-live", os.getpid())
    unowned = _folder(tmp_path, "worldserve-8000-old", None)
    other_port = _folder(tmp_path, "worldserve-8001-dead", gone.pid)

    made = make_run_dir(tmp_path, 8000)

    assert not dead.exists()
    assert living.exists() and unowned.exists() and other_port.exists()
    assert made.name.startswith("worldserve-8000-")
    assert (made / OWNER_FILE).read_text() == str(os.getpid())
