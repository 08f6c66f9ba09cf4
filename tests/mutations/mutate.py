"""Apply a plant to a temporary copy of the project and run the tests that claim to catch it.

The copy holds `worldserve/`, `tools/` and `benchmarks/` (the training tools and benchmark
scorers some tests import), `tests/` and `pyproject.toml`; pytest runs in it with its rootdir
there (pyproject's `pythonpath = ["."]` then imports the copied package, not the working tree)
and caches pointed into the copy, so a planted dev-model build can never reach the shared
cache.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from tests.mutations.plants import Plant
from tests.support.server import REPO_ROOT

COPIED = ("worldserve", "tools", "benchmarks", "tests", "pyproject.toml")
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "test-artifacts", ".pytest_cache")
RUN_TIMEOUT_S = 600


class AnchorNotFound(AssertionError):
    """The plant's anchor is not (exactly once) in its file: the code moved; re-anchor it."""


@dataclass(frozen=True)
class Outcome:
    """What pytest reported for one run: exit code and the node ids that failed / errored."""

    returncode: int
    failed: tuple[str, ...]
    errored: tuple[str, ...]
    output: str


def copy_project(target: Path) -> Path:
    """A copy of the project's code and tests under `target` (created)."""
    target.mkdir(parents=True)
    for name in COPIED:
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=IGNORED)
        else:
            shutil.copy2(source, target / name)
    return target


def apply(plant: Plant, project: Path) -> None:
    """Plant the bug in `project` (a copy); AnchorNotFound unless the anchor occurs once."""
    path = project / plant.path
    if not path.is_file():
        raise AnchorNotFound(f"plant {plant.name!r}: {plant.path} does not exist")
    text = path.read_text(encoding="utf-8")
    count = text.count(plant.anchor)
    if count != 1:
        raise AnchorNotFound(f"plant {plant.name!r}: its anchor occurs {count} times in "
                             f"{plant.path} (expected once): re-anchor it in tests/mutations/"
                             f"plants.py\n--- anchor ---\n{plant.anchor}")
    path.write_text(text.replace(plant.anchor, plant.replacement), encoding="utf-8")


def run_tests(project: Path, node_ids: list[str]) -> Outcome:
    """pytest over `node_ids` inside `project`, strict (`make test`'s mode), offline."""
    report = project / f"report-{uuid.uuid4().hex}.xml"
    cache = project / ".cache"
    env = dict(os.environ)
    env.update({"WORLDSERVE_TEST_STRICT": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "PYTHONPATH": str(project), "WORLDSERVE_CACHE_DIR": str(cache),
                "WORLDSERVE_DEV_MODELS_DIR": str(cache / "dev-models")})
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir",
               str(project), "-c", str(project / "pyproject.toml"), f"--junitxml={report}",
               *node_ids]
    done = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    failed, errored = _read_report(report) if report.is_file() else ((), ())
    return Outcome(done.returncode, failed, errored, done.stdout[-6000:] + done.stderr[-3000:])


def _read_report(report: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    failed, errored = [], []
    for case in ET.parse(report).getroot().iter("testcase"):
        node = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None:
            failed.append(node)
        if case.find("error") is not None:
            errored.append(node)
    return tuple(failed), tuple(errored)


def failed_in(outcome: Outcome, node_id: str) -> bool:
    """Whether a test of `node_id` (a test, any of its parametrisations, or a file) failed."""
    path, _, name = node_id.partition("::")
    want = path.removesuffix(".py").replace("/", ".") + (f"::{name}" if name else "")
    return any(node == want or node.startswith((want + "[", want + "::"))
               for node in outcome.failed)
