"""`docs/request-walks.md` is current: `python -m tools.request_walks --check` traces the four
requests again on the dev checkpoints and compares the (phase, calling file -> called file)
pairs with the committed page (function lists and order are informational: they may vary with
timing). When a change moves the path, regenerate: `python -m tools.request_walks`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.server import REPO_ROOT, base_env
from tools.request_walks import Step, Walk, pairs, render


def test_the_committed_walks_are_current(dev_models_dir: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "tools.request_walks", "--check"],
                          cwd=REPO_ROOT, env=base_env(), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]


def test_the_check_compares_file_pairs_per_phase() -> None:
    walk = Walk("a", "t", {"submission": [Step("api/a.py", "api/b.py", ["f", "g"])]})
    page = render([walk])
    assert pairs(page) == {"## (a) t / submission": {"- `api/a.py` -> `api/b.py`"}}
    reordered = render([Walk("a", "t", {"submission": [Step("api/a.py", "api/b.py", ["g"])]})])
    assert pairs(reordered) == pairs(page)  # function lists are not compared
    moved = render([Walk("a", "t", {"submission": [Step("api/a.py", "api/c.py", ["f"])]})])
    assert pairs(moved) != pairs(page)
