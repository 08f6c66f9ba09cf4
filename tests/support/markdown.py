"""The project's Markdown as data: which files, their relative links and heading anchors, and
their fenced examples with the marker that says whether the examples test runs them.

A runnable example is a fenced block preceded by `<!-- example: run -->`; one that needs what a
test machine lacks says so: `<!-- example: skip (needs an IP camera) -->`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.support.server import REPO_ROOT

# The front page, the docs and the benchmark guide; not the specs or notes of other trees.
DOC_GLOBS = ("README.md", "docs/**/*.md", "benchmarks/**/*.md", "examples/**/*.md")
# Where every fenced bash/python block is an example a reader may paste: each needs a marker.
EXAMPLE_DOCS = ("README.md", "docs/generation.md", "docs/streaming.md", "docs/nim.md",
                "docs/realtime.md", "docs/stream-client.md", "docs/playground.md",
                "docs/admin.md", "docs/operations.md")
EXAMPLE_LANGUAGES = ("bash", "sh", "shell", "python")

_FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")
_MARKER = re.compile(r"^<!--\s*example:\s*(run|skip)\b\s*(.*?)\s*-->\s*$")
_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_INLINE_CODE = re.compile(r"`+[^`]*`+")
_HTML_ID = re.compile(r"""<a\s+(?:name|id)=["']([^"']+)["']""")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int          # the opening fence's line, 1-based
    language: str
    body: str
    marker: str | None  # "run", "skip", or None when the block has no marker
    reason: str         # a skip's reason


def doc_files(root: Path = REPO_ROOT) -> list[Path]:
    found = {path for pattern in DOC_GLOBS for path in root.glob(pattern)}
    return sorted(path for path in found if ".venv" not in path.parts)


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced blocks, inline code removed."""
    lines, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        opening = _FENCE.match(line)
        if opening and (fence is None or opening.group(2).startswith(fence)):
            fence = opening.group(2) if fence is None else None
            continue
        if fence is None:
            lines.append((number, _INLINE_CODE.sub("", line)))
    return lines


def links(text: str) -> list[tuple[int, str]]:
    """(line, target) of every Markdown link and image outside code."""
    return [(number, match.group(1)) for number, line in _prose_lines(text)
            for match in _LINK.finditer(line)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|__", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a link into this text may name (GitHub numbers repeated headings)."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    lines, fence = text.splitlines(), None
    for line in lines:
        opening = _FENCE.match(line)
        if opening and (fence is None or opening.group(2).startswith(fence)):
            fence = opening.group(2) if fence is None else None
            continue
        if fence is not None:
            continue
        found.update(_HTML_ID.findall(line))
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def blocks(path: Path) -> list[Block]:
    """Every fenced block of a file with its example marker (the line before the fence, blank
    lines skipped)."""
    lines = path.read_text().splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        fence, language = opening.group(2), opening.group(3).lower()
        end = index + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        before = index - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        marker = _MARKER.match(lines[before].strip()) if before >= 0 else None
        found.append(Block(path, index + 1, language, "\n".join(lines[index + 1:end]) + "\n",
                           marker.group(1) if marker else None,
                           marker.group(2).strip("() ") if marker else ""))
        index = end + 1
    return found


def examples(root: Path = REPO_ROOT) -> list[Block]:
    """The bash and python blocks of the example docs, in file order."""
    return [block for name in EXAMPLE_DOCS for block in blocks(root / name)
            if block.language in EXAMPLE_LANGUAGES]
