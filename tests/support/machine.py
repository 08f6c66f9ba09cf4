"""Tests that need something of the machine (a browser, an optional package).

`make test` sets WORLDSERVE_TEST_STRICT=1: a missing requirement then fails the test with
what to install, so a newcomer's green run is CI's green run. A plain `pytest` run skips.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

STRICT_ENV = "WORLDSERVE_TEST_STRICT"


def strict() -> bool:
    return os.environ.get(STRICT_ENV, "").strip() in {"1", "true", "yes"}


def missing(reason: str) -> None:
    """Skip (plain pytest) or fail (`make test`) because the machine lacks something."""
    if strict():
        pytest.fail(f"{reason} ({STRICT_ENV}=1: `make test` does not skip this)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require_module(name: str, install: str = "pip install -e '.[dev]'") -> ModuleType:
    """importorskip that fails under `make test`."""
    try:
        return importlib.import_module(name)
    except ImportError:
        missing(f"the {name} package is not installed ({install})")
        raise  # unreachable: missing() raises
