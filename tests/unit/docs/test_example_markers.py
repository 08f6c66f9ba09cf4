"""Every bash and python example of the README and the surface docs says whether
tests/integration/docs/test_examples.py runs it (`<!-- example: run -->`) or why not
(`<!-- example: skip (why) -->`), so a new example cannot slip past that test."""

from __future__ import annotations

from pathlib import Path

from tests.support import markdown
from tests.support.server import REPO_ROOT


def test_every_example_is_marked() -> None:
    examples = markdown.examples()
    where = {block: f"{block.path.relative_to(REPO_ROOT)}:{block.line}" for block in examples}
    assert [where[block] for block in examples if block.marker is None] == []
    assert [where[block] for block in examples if block.marker == "skip" and not block.reason] == []
    assert {block.marker for block in examples} == {"run", "skip"}


def test_markers_are_read_from_the_line_before_the_fence(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- example: run -->\n```bash\ncurl -s x\n```\n\n"
                    "<!-- example: skip (needs a camera) -->\n\n```python\nprint(1)\n```\n"
                    "Prose.\n```bash\nunmarked\n```\n")
    got = [(block.line, block.language, block.marker, block.reason, block.body)
           for block in markdown.blocks(page)]
    assert got == [(2, "bash", "run", "", "curl -s x\n"),
                   (8, "python", "skip", "needs a camera", "print(1)\n"),
                   (12, "bash", None, "", "unmarked\n")]
