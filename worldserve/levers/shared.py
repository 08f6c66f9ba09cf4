"""Modules one stage loader publishes for another loader in the same process.

A colocated stage process (`stages.reasoner.colocate_with_generation`) loads the generation
engine first, then the reasoner. A generator family whose weights another family can reuse
publishes the module under its model directory and a role (the Cosmos3 generator: its
`transformer`); the other family's loader looks it up (the Cosmos3 reasoner ties its LLM to it).
In separate processes the lookup finds nothing and each loader keeps its own copy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

GENERATOR_TRANSFORMER = "generator_transformer"

_MODULES: dict[tuple[str, str], Any] = {}


def _key(model_dir: Path | str, role: str) -> tuple[str, str]:
    return str(Path(model_dir).expanduser().resolve()), role


def publish(model_dir: Path | str, role: str, module: Any) -> None:
    """Offer `module` (loaded from `model_dir`) to later loaders in this process."""
    _MODULES[_key(model_dir, role)] = module


def lookup(model_dir: Path | str, role: str) -> Any | None:
    """The module published for `model_dir` under `role`, or None."""
    return _MODULES.get(_key(model_dir, role))


def withdraw(model_dir: Path | str, role: str) -> None:
    """Forget a published module (its engine shut down)."""
    _MODULES.pop(_key(model_dir, role), None)
