"""`worldserve serve --help` in an 80-column terminal, as a person runs it (a child process):
nothing past column 80, no option name cut, every default shown, brackets kept literally."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from worldserve.config.flags import SERVE_FLAGS, default_text

COLUMNS = 80


@pytest.fixture(scope="module")
def help_lines() -> list[str]:
    env = {**os.environ, "COLUMNS": str(COLUMNS)}
    done = subprocess.run([sys.executable, "-m", "worldserve", "serve", "--help"],
                          capture_output=True, text=True, env=env, timeout=120, check=True)
    return done.stdout.splitlines()


def test_no_line_is_wider_than_the_terminal(help_lines: list[str]) -> None:
    wide = [line for line in help_lines if len(line) > COLUMNS]
    assert not wide


def test_every_option_name_is_whole_on_its_line(help_lines: list[str]) -> None:
    starts = [line.strip() for line in help_lines]
    for flag in SERVE_FLAGS:
        spelled = " / ".join(flag.name.split("/"))
        assert any(line.startswith(spelled) for line in starts), spelled
    for name in ("--model-path", "--config", "--admin-key-file", "--cluster", "--ray-address",
                 "--replicas", "--api-replicas"):
        assert any(line.startswith(name + " ") for line in starts), name


def test_every_default_is_shown(help_lines: list[str]) -> None:
    text = " ".join(" ".join(help_lines).split())  # the wrapping undone
    for flag in SERVE_FLAGS:
        at = text.index(" / ".join(flag.name.split("/")))
        shown = text.index("[default: ", at)
        assert text[shown:].startswith(f"[default: {default_text(flag)}"), flag.name
    options = [line for line in help_lines if line.strip().startswith("--")]
    assert text.count("[default: ") == len(options) - 1  # all but --help
    assert "Bind address of the HTTP server. [default: 127.0.0.1]" in text
    assert "[default: 8000]" in text


def test_help_text_reads_literally(help_lines: list[str]) -> None:
    text = " ".join(" ".join(help_lines).split())
    assert "worldserve[ray]" in text
    assert "--step-cache-method seacache|taylorseer" in text
    assert "--attention-backend <str> The transformer's attention kernel" in text
    assert "--colocation-yield blocks|steps" in text
    assert "$NIM_STREAMING_MAX_SESSIONS" in text
    assert "Live video reasoning (NIM settings; each flag wins over its NIM_* variable):" in text
