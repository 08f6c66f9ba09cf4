"""Per-server run folders (the stages' ipc sockets and config) under WORLDSERVE_RUN_DIR.

A server removes its folder when it stops; one that was SIGKILLed cannot, so the next server on
the same port removes the folders whose owner (`owner.pid`, written at creation) is gone. A
folder without an owner file, or whose owner lives, is left alone.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger("worldserve.supervisor")

OWNER_FILE = "owner.pid"


def make_run_dir(root: Path, port: int) -> Path:
    """A new run folder for the server on `port`, after removing that port's stale ones."""
    remove_stale(root, port)
    run_dir = Path(tempfile.mkdtemp(prefix=f"worldserve-{port}-", dir=root))
    (run_dir / OWNER_FILE).write_text(str(os.getpid()))
    return run_dir


def remove_stale(root: Path, port: int) -> list[Path]:
    """Remove `port`'s run folders whose owner process is gone; the ones removed."""
    removed = []
    for folder in root.glob(f"worldserve-{port}-*"):
        try:
            owner = int((folder / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # no owner written: not ours to judge
        if not _alive(owner):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
            log.info("removed the run folder %s of a server that did not stop (pid %d)",
                     folder.name, owner)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
