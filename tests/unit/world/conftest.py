"""Fixtures of the world training stages' tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture()
def tied(tmp_path: Path):
    """A dev world directory's generator and its reasoner, tied as serving ties them (the
    reasoner's LLM is the generator transformer's understanding pathway)."""
    from worldserve.models.cosmos3.dev import build_world
    from worldserve.models.cosmos3.runner import load_runner as load_generator
    from worldserve.models.cosmos3_reasoner.loader import load_runner as load_reasoner

    build_world(tmp_path, 0)
    generator = load_generator(tmp_path)
    return generator, load_reasoner(tmp_path, generator=generator.pipe.transformer)
