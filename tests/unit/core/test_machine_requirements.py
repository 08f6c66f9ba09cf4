"""`make test` never skips for something the machine lacks (tests/support/machine.py): the same
missing requirement skips under plain pytest and fails under WORLDSERVE_TEST_STRICT=1, and no
test file skips around that helper."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.server import REPO_ROOT, base_env

PROBE = '''
from tests.support.machine import missing, require_module

def test_browser():
    missing("/nowhere/chromium not found: install Debian's chromium")

def test_package():
    require_module("no_such_package_for_worldserve")
'''


@pytest.mark.parametrize(("strict", "outcome"), [("", "2 skipped"), ("1", "2 failed")])
def test_missing_requirement_skips_or_fails(tmp_path: Path, strict: str, outcome: str) -> None:
    probe = tmp_path / "test_probe.py"
    probe.write_text(PROBE)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir",
         str(tmp_path), str(probe)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
        env=base_env(WORLDSERVE_TEST_STRICT=strict))
    assert outcome in done.stdout, done.stdout + done.stderr
    if strict:
        assert "make test` does not skip this" in done.stdout


def test_ensure_chromium_names_what_to_do(tmp_path: Path) -> None:
    script = REPO_ROOT / "tests" / "e2e" / "ensure-chromium.sh"
    bad = subprocess.run([str(script)], capture_output=True, text=True, timeout=30,
                         env={"PATH": "/usr/bin:/bin", "WORLDSERVE_E2E_CHROMIUM": "/nowhere"})
    assert bad.returncode == 1 and "WORLDSERVE_E2E_CHROMIUM=/nowhere" in bad.stderr
    fake = tmp_path / "chromium"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    good = subprocess.run([str(script)], capture_output=True, text=True, timeout=30,
                          env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert good.returncode == 0 and good.stdout.strip() == str(fake)


SKIPPING = {"skip", "skipif", "importorskip", "xfail"}
HELPER = Path("tests/support/machine.py")


def _pytest_skip_calls(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every `pytest.<skip...>` / `pytest.mark.<skip...>` reference."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in SKIPPING:
            owner = node.value
            if isinstance(owner, ast.Attribute) and owner.attr == "mark":
                owner = owner.value
            if isinstance(owner, ast.Name) and owner.id == "pytest":
                found.append((node.lineno, node.attr))
    return found


def test_only_the_strict_helper_skips() -> None:
    """A test that cannot run here goes through tests/support/machine.py, so `make test` fails
    instead of skipping: no test file calls pytest's skip machinery itself."""
    found = [f"{path.relative_to(REPO_ROOT)}:{line} pytest {name}"
             for path in sorted((REPO_ROOT / "tests").rglob("*.py"))
             if path.relative_to(REPO_ROOT) != HELPER
             for line, name in _pytest_skip_calls(ast.parse(path.read_text(), str(path)))]
    assert not found, "skips around the strict helper:\n" + "\n".join(found)


def test_the_skip_scan_sees_every_form() -> None:
    tree = ast.parse("import pytest\npytest.importorskip('x')\n@pytest.mark.skipif(True, "
                     "reason='r')\ndef f():\n    pytest.skip('y')\n")
    assert sorted(name for _, name in _pytest_skip_calls(tree)) == [
        "importorskip", "skip", "skipif"]
