"""Deterministic tiny "dev checkpoints": random-weight models of the real architectures.

`build_dev_models(root)` writes one Hugging Face-layout directory per entry of `BUILDERS`
(`root/reasoner/`, `root/generation/`), each from a fixed seed, so the loaders that serve real
checkpoints serve these too. A directory counts as built only once its `worldserve_dev.json`
marker exists: each model is built in a temporary sibling directory, the marker is written last,
and the directory is renamed into place.

This module imports no model library; a builder's module is imported when it runs.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from worldserve.ipc.capabilities import GenerationDefaults

logger = logging.getLogger(__name__)

# Bump whenever a builder's output changes: a marker with another version is rebuilt.
# 2: the generation checkpoint has an action_head/; 3: generation/ is Cosmos3, Wan moved to wan/
# 4: the Cosmos3 generation directory holds its reasoner too; 5: Cosmos3 norms are not 1.0
# 6: the dev reasoners' context is the real models' max_position_embeddings (was 4096)
# 7: world/, the Cosmos3 directory trained on the dev world, is the default served model
# 8: world/'s sound tokenizer and the transformer's sound pathway are trained (tone per colour)
# 9: world-drafter/, the DFlash drafter trained against world/'s reasoner
# 10: realtime/ is the causal model trained on the dev world's agent (keys steer it)
# 11: realtime/'s later chunks trained (the DiT over a session's cache, the VAE decoder on
#     whole sessions)
DEV_MODELS_VERSION = "11"
DEV_MODELS_SEED = 0
MARKER_NAME = "worldserve_dev.json"
_TMP_PREFIX = ".tmp-"
# A temporary build directory older than this is left over from a crashed build (a real
# build takes seconds), so it is safe to delete.
_STALE_TMP_AGE_S = 600.0

# What a tiny dev checkpoint runs in seconds on a CPU (GenerationDefaults' limits): sides up to
# 256, and the NIM's longest clip (397 frames) at its largest dev key (80x80); 1280x720 x 189
# frames is refused with a 400 instead of running for hours.
DEV_LIMITS: dict[str, int] = dict(max_width=256, max_height=256, max_pixels=256 * 256,
                                  max_num_frames=397, max_video_pixels=80 * 80 * 397)


# The dev world's sizes (models/dev/world/scenes.py WorldConfig): the trained model draws what
# it was trained on, 64x64 frames, 9 of them at 24 fps; 12 steps at guidance 3 is what
# benchmarks/quality.py measured (docs/dev-world.md).
WORLD_SAMPLING_DEFAULTS: dict[str, Any] = dict(
    width=64, height=64, image_width=64, image_height=64, num_frames=9, fps=24,
    num_inference_steps=12, guidance_scale=3.0)


@dataclass(frozen=True)
class DevModelBuilder:
    """One dev model: the id it is served under and `module:function` that writes it.

    The function has the signature `builder(target_dir: Path, seed: int) -> None` and writes a
    complete checkpoint into `target_dir` (which exists and is empty).
    """

    served_model_name: str
    entry_point: str
    # Written into the marker: sampling defaults that replace the family's dev ones for this
    # checkpoint (checkpoint_defaults), e.g. the size its weights were trained at.
    sampling_defaults: dict[str, Any] | None = None

    def __call__(self, target_dir: Path, seed: int) -> None:
        module_name, function_name = self.entry_point.split(":")
        build: Callable[[Path, int], None] = getattr(
            importlib.import_module(module_name), function_name
        )
        build(target_dir, seed)


# name (directory under the root) -> builder. Add a model by adding one entry.
BUILDERS: dict[str, DevModelBuilder] = {
    "reasoner": DevModelBuilder(
        "worldserve-dev-reasoner", "worldserve.models.qwen_vl.dev:build_reasoner"
    ),
    # The default generation model: a tiny Cosmos3 generator (sound and action heads).
    "generation": DevModelBuilder(
        "worldserve-dev-cosmos3", "worldserve.models.cosmos3.dev:build_generation"
    ),
    # Not a stage folder: serve it with `--model-path <root>/wan`.
    "wan": DevModelBuilder(
        "worldserve-dev-wan", "worldserve.models.wan.dev:build_generation"
    ),
    # The causal realtime model trained on the dev world's agent (shipped weights): a session
    # from an agent frame moves it the way the held keys command (docs/dev-world.md).
    "realtime": DevModelBuilder(
        "worldserve-dev-causal-wan", "worldserve.models.causal_dit.dev:build_realtime_world"
    ),
    # A standalone Cosmos3 Omni reasoner (the Cosmos3 dev directory holds one beside its
    # generator); served with `--model-path <root>/cosmos3-reasoner`.
    "cosmos3-reasoner": DevModelBuilder(
        "worldserve-dev-cosmos3-reasoner", "worldserve.models.cosmos3_reasoner.dev:build_omni"
    ),
    # The default `worldserve serve` model: the Cosmos3 dev directory (generator and reasoner)
    # with weights trained on the dev world (docs/dev-world.md), at the world's size.
    "world": DevModelBuilder(
        "worldserve-dev-cosmos3", "worldserve.models.cosmos3.dev:build_world",
        sampling_defaults=WORLD_SAMPLING_DEFAULTS,
    ),
    # A DFlash drafter for the Cosmos3 dev reasoner: `--streaming-spec-method dflash
    # --streaming-spec-model-path <root>/cosmos3-drafter`.
    "cosmos3-drafter": DevModelBuilder(
        "worldserve-dev-cosmos3-drafter", "worldserve.models.dflash.dev:build_drafter"
    ),
    # The DFlash drafter trained against world/'s reasoner (shipped weights): serve world/ with
    # `--streaming-spec-method dflash --streaming-spec-model-path <root>/world-drafter`.
    "world-drafter": DevModelBuilder(
        "worldserve-dev-world-drafter", "worldserve.models.dflash.world:build_world_drafter"
    ),
}


def read_marker(model_dir: Path) -> dict[str, Any] | None:
    """The marker of a complete dev model directory, or None when it is missing or unreadable."""
    try:
        marker = json.loads((Path(model_dir) / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def checkpoint_defaults(model_dir: Path, real: GenerationDefaults,
                        dev: GenerationDefaults) -> GenerationDefaults:
    """A generation family's sampling defaults for `model_dir`: `dev` for a dev checkpoint (it
    has a marker; the marker's `sampling_defaults` object overrides single fields), else `real`.
    A marker that cannot be read still marks a dev checkpoint."""
    if not (Path(model_dir) / MARKER_NAME).is_file():
        return real
    overrides = (read_marker(model_dir) or {}).get("sampling_defaults")
    if not isinstance(overrides, dict):
        return dev
    known = {k: v for k, v in overrides.items() if k in GenerationDefaults.__struct_fields__}
    return msgspec.structs.replace(dev, **known)


def dev_model_ready(model_dir: Path, name: str) -> bool:
    """True when `model_dir` holds a complete build of `name` at the current version."""
    marker = read_marker(model_dir)
    return (
        marker is not None
        and marker.get("name") == name
        and marker.get("version") == DEV_MODELS_VERSION
    )


def dev_models_ready(root: Path) -> bool:
    """True when every model in `BUILDERS` is completely built under `root`."""
    return all(dev_model_ready(Path(root) / name, name) for name in BUILDERS)


def build_dev_models(root: Path, *, force: bool = False) -> dict[str, Path]:
    """Build every dev model under `root` (skipping complete ones unless `force`).

    Returns name -> model directory, e.g. {"reasoner": root/"reasoner", ...}.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp_dirs(root)
    built = {}
    for name, builder in BUILDERS.items():
        target = root / name
        if force or not dev_model_ready(target, name):
            _build_one(name, builder, target, force=force)
        else:
            logger.info("dev model %s is up to date at %s", name, target)
        built[name] = target
    return built


def _build_one(name: str, builder: DevModelBuilder, target: Path, *, force: bool) -> None:
    """Build into a temporary sibling directory, write the marker last, rename into place."""
    start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{name}-", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is readable like any checkpoint
    try:
        builder(tmp, DEV_MODELS_SEED)
        _write_marker(tmp, name, builder)
        if not force and dev_model_ready(target, name):
            logger.info("dev model %s was built meanwhile by another process", name)
            return
        _replace_dir(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already after a successful rename
    logger.info(
        "built dev model %s (%s) in %.1f s at %s",
        name, builder.served_model_name, time.perf_counter() - start, target,
    )


def _write_marker(model_dir: Path, name: str, builder: DevModelBuilder) -> None:
    marker = {
        "name": name,
        "served_model_name": builder.served_model_name,
        "version": DEV_MODELS_VERSION,
        "seed": DEV_MODELS_SEED,
        "builder": builder.entry_point,
    }
    if builder.sampling_defaults is not None:
        marker["sampling_defaults"] = builder.sampling_defaults
    (model_dir / MARKER_NAME).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")


def _replace_dir(new: Path, target: Path) -> None:
    """Move `new` to `target`; an existing `target` is moved aside first, then deleted."""
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{target.name}-old-", dir=target.parent))
        os.replace(target, old / target.name)
    os.replace(new, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _remove_stale_tmp_dirs(root: Path) -> None:
    now = time.time()
    for path in root.glob(f"{_TMP_PREFIX}*"):
        try:
            if path.is_dir() and now - path.stat().st_mtime > _STALE_TMP_AGE_S:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            continue  # another builder removed it meanwhile
