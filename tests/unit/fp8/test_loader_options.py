"""A loader option a family does not take is a startup error naming it, not a TypeError."""

from __future__ import annotations

from pathlib import Path

import pytest

from worldserve.models import registry
from worldserve.models.types import ModelLoadError


def test_fp8_compute_on_a_family_without_fp8_names_the_option(dev_models_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"stages.generation: fp8_compute does not apply to "
                                             r"the wan family"):
        registry.load_runner("generation", dev_models_dir / "wan", dtype="float32",
                             device="cpu", fp8_compute="w8a16")


def test_options_the_loader_takes_pass_through(dev_models_dir: Path) -> None:
    runner = registry.load_runner("generation", dev_models_dir / "wan", dtype="float32",
                                  device="cpu")
    assert runner.pipe is not None
