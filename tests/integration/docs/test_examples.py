"""The README's and the surface docs' examples run as written against a real `make serve` server.

Each example a reader may paste is a fenced bash or python block marked `<!-- example: run -->`
(or `<!-- example: skip (why) -->` when it needs what a test machine lacks: a camera, a LoRA
directory, a second server). Only the address changes: `localhost:8000` / `127.0.0.1:8000`
become the test server's, and `WORLDSERVE_URL` names it for `worldserve stream`. They run from a
folder that holds `examples/` (the sample inputs that ship with the project), as from a clone's
root. A doc's bash blocks run in one shell, in order, as a reader pastes them into one terminal
(`admin.md` sets `$H` once); each python block is its own program. That every example carries
a marker is tests/unit/docs/test_example_markers.py's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.support import machine, markdown
from tests.support.server import REPO_ROOT, ServerProcess, base_env
from worldserve.cli import DEV_STAGE_DEFAULTS

EXAMPLES = markdown.examples()
BASH = sorted({block.path for block in EXAMPLES
               if block.marker == "run" and block.language != "python"},
              key=lambda path: markdown.EXAMPLE_DOCS.index(str(path.relative_to(REPO_ROOT))))
PYTHON = [block for block in EXAMPLES if block.marker == "run" and block.language == "python"]
ADDRESSES = ("localhost:8000", "127.0.0.1:8000")
EXAMPLE_TIMEOUT_S = 240
# An error envelope (`{"error": {...}}`; a job's `"error": null` is no failure) or a traceback.
FAILURE = re.compile(r'"error"\s*:\s*(?!\s|null)|Traceback \(most recent call last\)')


def name(block: markdown.Block) -> str:
    return f"{block.path.relative_to(REPO_ROOT)}:{block.line}"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory,
           dev_models_dir: Path) -> Iterator[ServerProcess]:
    """`make serve`'s stages: the Cosmos3 dev directory (generator and reasoner) and the dev
    causal model on the realtime stage (worldserve/cli.py DEV_STAGE_DEFAULTS)."""
    stages = {name: {"model_path": str(dev_models_dir / folder)}
              for name, folder in DEV_STAGE_DEFAULTS.items()}
    process = ServerProcess(tmp_path_factory.mktemp("examples-server"), {"stages": stages})
    try:
        process.wait_healthy(timeout_s=180)
        yield process
    finally:
        process.stop()


@pytest.fixture
def clone_root(tmp_path: Path) -> Path:
    """A folder like a clone's root for what the examples read (examples/) and write."""
    (tmp_path / "examples").symlink_to(REPO_ROOT / "examples")
    return tmp_path


def run(command: list[str], source: str, server: ServerProcess, cwd: Path) -> str:
    for address in ADDRESSES:
        source = source.replace(address, f"127.0.0.1:{server.port}")
    env = base_env(WORLDSERVE_URL=server.base_url)
    # `worldserve`, `python3` and `pip` as a reader's activated .venv has them
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    done = subprocess.run([*command, source], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=EXAMPLE_TIMEOUT_S)
    output = done.stdout + done.stderr
    tail = output[-4000:]  # a b64 image is long; the end says what went wrong
    assert done.returncode == 0, (
        f"exit {done.returncode}:\n{tail}\n--- server log:\n{server.log()[-3000:]}")
    assert done.stdout.strip(), f"no output:\n{tail}"
    refusal = FAILURE.search(output)
    assert refusal is None, (
        f"{refusal.group(0)!r} in the output:\n{output[max(0, refusal.start() - 2000):][:4000]}")
    return done.stdout


@pytest.mark.parametrize("doc", BASH, ids=lambda path: str(path.relative_to(REPO_ROOT)))
def test_bash_examples(doc: Path, server: ServerProcess, clone_root: Path) -> None:
    if shutil.which("curl") is None:
        machine.missing("the examples use curl (apt-get install curl)")
    script = "\n".join(f"echo '# {name(block)}' >&2\n{block.body}"
                       for block in markdown.blocks(doc)
                       if block.marker == "run" and block.language != "python")
    run(["bash", "-e", "-o", "pipefail", "-c"], script, server, clone_root)


@pytest.mark.parametrize("block", PYTHON, ids=name)
def test_python_examples(block: markdown.Block, server: ServerProcess, clone_root: Path) -> None:
    run([sys.executable, "-c"], block.body, server, clone_root)
