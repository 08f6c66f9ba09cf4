"""Model directory -> model family -> the runner a stage drives.

Engines call `load_runner(stage_kind, model_dir, ...)` and get an object satisfying their runner
contract (`engines/<kind>/contract.py`); they never import a family module. Detection reads JSON
files only; the family's loader module (and torch with it) is imported when a stage loads it.
Add a family: a folder under `worldserve/models/` with a `family.py` declaring `FAMILY`, then
one entry in `FAMILIES` below (docs/architecture.md has the checklist). A family from outside
this package is a plugin: an installed distribution whose entry point in the group
`worldserve.model_families` names its `ModelFamily`; it comes after the built-in families.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
from pathlib import Path
from typing import Any

from worldserve.models.action_head.family import FAMILY as ACTION_HEAD
from worldserve.models.action_head.family import SUBDIR as ACTION_HEAD_SUBDIR
from worldserve.models.causal_dit.family import FAMILY as CAUSAL_DIT
from worldserve.models.cosmos3.family import FAMILY as COSMOS3
from worldserve.models.cosmos3_reasoner.family import FAMILY as COSMOS3_REASONER
from worldserve.models.detect import describe
from worldserve.models.dev import read_marker
from worldserve.models.qwen_vl.family import FAMILY as QWEN_VL
from worldserve.models.sana_wm.family import FAMILY as SANA_WM
from worldserve.models.types import ModelFamily, ModelLoadError, ModelProfile
from worldserve.models.wan.family import FAMILY as WAN

__all__ = ["FAMILIES", "PLUGIN_GROUP", "ModelFamily", "dev_marker", "families", "load_actions",
           "load_drafter", "load_runner", "profile", "resolve", "stage_kinds", "supported"]

# Order matters: the first family whose `detect` matches (and that serves the stage kind) wins.
FAMILIES: tuple[ModelFamily, ...] = (
    COSMOS3,
    WAN,
    ACTION_HEAD,
    QWEN_VL,
    COSMOS3_REASONER,
    CAUSAL_DIT,
    SANA_WM,
)
PLUGIN_GROUP = "worldserve.model_families"  # entry points naming a plugin's ModelFamily


def families() -> tuple[ModelFamily, ...]:
    """The built-in `FAMILIES`, then the plugin families (in entry-point name order)."""
    return FAMILIES + _plugin_families()


@functools.cache
def _plugin_families() -> tuple[ModelFamily, ...]:
    found = []
    points = sorted(importlib.metadata.entry_points(group=PLUGIN_GROUP), key=lambda p: p.name)
    for point in points:
        family = point.load()
        if not isinstance(family, ModelFamily):
            raise ModelLoadError(f"model family plugin {point.name} ({point.value}) is a "
                                 f"{type(family).__name__}, not a ModelFamily")
        found.append(family)
    return tuple(found)


def supported(stage_kind: str) -> list[str]:
    """Names of the families that serve `stage_kind`."""
    return [family.name for family in families() if stage_kind in family.loaders]


def stage_kinds(model_dir: Path) -> list[str]:
    """Every stage kind some family serves from `model_dir` (JSON reads only), e.g.
    ["generation", "reasoner"] for a Cosmos3 directory holding the generator and the reasoner;
    a family's `explicit_kinds` are left out (they need the stage's own model_path)."""
    model_dir = Path(model_dir)
    kinds: list[str] = []
    for family in families():
        if family.detect(model_dir):
            kinds += [kind for kind in family.loaders
                      if kind not in kinds and kind not in family.explicit_kinds]
    return kinds


def resolve(stage_kind: str, model_dir: Path) -> ModelFamily:
    """The family serving `stage_kind` from `model_dir`; ModelLoadError names what was found."""
    model_dir = Path(model_dir)
    for family in families():
        if stage_kind in family.loaders and family.detect(model_dir):
            return family
    raise ModelLoadError(
        f"{model_dir} is not a model directory the {stage_kind} stage can serve: found "
        f"{describe(model_dir)}; supported {stage_kind} families: "
        f"{', '.join(supported(stage_kind)) or 'none'}")


def check_attention_backend(stage_kind: str, model_dir: Path, backend: str) -> None:
    """ModelLoadError when the family serving `model_dir` does not allow `backend` (JSON reads
    only: a stage refuses it before loading any weight)."""
    family = resolve(stage_kind, model_dir)
    allowed = family.attention_backends
    if allowed is not None and backend not in allowed:
        raise ModelLoadError(f"attention_backend {backend!r} is not allowed for the "
                             f"{family.name} family (it gives wrong attention there); use one "
                             f"of: {', '.join(sorted(allowed))}")


def load_runner(stage_kind: str, model_dir: Path, **kwargs: Any) -> Any:
    """Resolve the family, import its loader for `stage_kind` and call it."""
    family = resolve(stage_kind, model_dir)
    module_name, function_name = family.loaders[stage_kind].split(":")
    loader = getattr(importlib.import_module(module_name), function_name)
    if "auto" in (kwargs.get("device"), kwargs.get("dtype")):  # an engine built by hand
        from worldserve.models.common import resolve_device_names

        kwargs["device"], kwargs["dtype"] = resolve_device_names(kwargs.get("device", "cpu"),
                                                          kwargs.get("dtype", "float32"))
    _check_loader_options(family.name, stage_kind, loader, kwargs)
    return loader(Path(model_dir), **kwargs)


def _check_loader_options(family: str, stage_kind: str, loader: Any,
                          options: dict[str, Any]) -> None:
    """A stage option the family's loader does not take (e.g. `fp8_compute` for a family
    without FP8 checkpoints) is a startup error naming it, not a TypeError."""
    accepted = inspect.signature(loader).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
        return
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ModelLoadError(f"stages.{stage_kind}: {', '.join(unknown)} does not apply to the "
                             f"{family} family (its loader has no such option)")


def profile(stage_kind: str, model_dir: Path, dtype: str) -> ModelProfile:
    """The checkpoint's NIM profile as its family reads it (file reads only)."""
    family = resolve(stage_kind, model_dir)
    target = family.profiles.get(stage_kind)
    if target is None:
        return ModelProfile.plain(dtype)
    module_name, function_name = target.split(":")
    return getattr(importlib.import_module(module_name), function_name)(Path(model_dir), dtype)


def load_actions(model_dir: Path, **kwargs: Any) -> Any | None:
    """The runner of the action head a generation checkpoint may carry in its `action_head/`
    folder (`models/action_head`); None when it has none."""
    head_dir = Path(model_dir) / ACTION_HEAD_SUBDIR
    if not (head_dir / "config.json").is_file():
        return None
    return load_runner("actions", head_dir, **kwargs)


def load_drafter(drafter_dir: Path, target: Any, **kwargs: Any) -> Any:
    """A speculative-decoding drafter attached to `target` (the reasoner's loaded model): a
    DFlash drafter directory (`models/dflash`); ModelLoadError names what was found."""
    module = importlib.import_module("worldserve.models.dflash.drafter")
    return module.load_drafter(Path(drafter_dir), target, **kwargs)


def dev_marker(model_dir: Path) -> dict[str, Any] | None:
    """The dev-checkpoint marker of `model_dir` (`models/dev`), None for any other directory."""
    return read_marker(model_dir)
