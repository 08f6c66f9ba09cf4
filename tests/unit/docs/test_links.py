"""Every relative link in the project's Markdown (README, docs/, benchmarks/README.md) points at a
file that exists, and at a heading that exists where it names an #anchor."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

from tests.support import markdown
from tests.support.server import REPO_ROOT


def broken_links(files: list[Path], root: Path) -> list[str]:
    broken = []
    for path in files:
        for line, target in markdown.links(path.read_text()):
            if "://" in target or target.startswith(("mailto:", "/")):
                continue  # remote and site-absolute links are not this test's
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / unquote(file_part)).resolve() if file_part else path
            where = f"{path.relative_to(root)}:{line}: {target}"
            if not linked.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in markdown.anchors(
                    linked.read_text()):
                broken.append(f"{where} (no heading #{anchor} in {linked.name})")
    return broken


def test_every_relative_link_resolves() -> None:
    files = markdown.doc_files()
    assert REPO_ROOT / "README.md" in files and REPO_ROOT / "benchmarks" / "README.md" in files
    assert broken_links(files, REPO_ROOT) == []


def test_the_checker_finds_a_missing_file_and_a_missing_heading(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "there.md").write_text("# There\n\n## A `code` heading (v2)\n")
    page = tmp_path / "README.md"
    page.write_text("[ok](docs/there.md#a-code-heading-v2) [gone](docs/gone.md)\n"
                    "[no heading](docs/there.md#nowhere) [self](#top) [web](https://x.org/a)\n"
                    "`[in code](docs/gone.md)`\n\n```\n[in a fence](docs/gone.md)\n```\n# Top\n")
    assert broken_links([page], tmp_path) == [
        "README.md:1: docs/gone.md (no such file)",
        "README.md:2: docs/there.md#nowhere (no heading #nowhere in there.md)",
    ]


def test_repeated_headings_get_numbered_anchors() -> None:
    assert markdown.anchors("# Tests\n## Tests\n### Tests\n") == {"tests", "tests-1", "tests-2"}
