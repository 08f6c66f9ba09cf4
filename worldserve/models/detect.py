"""Cheap facts about a model directory for family detection: JSON reads only, no model library."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

MODEL_INDEX = "model_index.json"  # diffusers pipelines
CONFIG = "config.json"  # transformers models (and the dev action head)
REALTIME_CONFIG = "realtime_config.json"  # the project's causal realtime layout


MAX_HEADER_BYTES = 100 * 1024 * 1024  # a larger header is no safetensors file we load


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`, or None when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file, its first 8 + N bytes only: tensor name ->
    {dtype, shape, data_offsets}, and `__metadata__` when the file has one."""
    from worldserve.models.types import ModelLoadError

    try:
        with Path(path).open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > MAX_HEADER_BYTES:
                raise ModelLoadError(f"{path}: safetensors header of {length} bytes")
            header = json.loads(f.read(length))
    except (OSError, ValueError, struct.error) as exc:
        raise ModelLoadError(f"{path}: not a readable safetensors file ({exc})") from None
    if not isinstance(header, dict):
        raise ModelLoadError(f"{path}: the safetensors header is not an object")
    return header


def diffusers_class(model_dir: Path) -> str | None:
    """`_class_name` of `model_index.json` (e.g. "WanPipeline")."""
    value = (read_json(model_dir / MODEL_INDEX) or {}).get("_class_name")
    return value if isinstance(value, str) else None


def transformers_type(model_dir: Path) -> str | None:
    """`model_type` of `config.json` (e.g. "qwen2_5_vl")."""
    value = (read_json(model_dir / CONFIG) or {}).get("model_type")
    return value if isinstance(value, str) else None


def describe(model_dir: Path) -> str:
    """What detection saw, for error messages."""
    found = []
    if (model_dir / MODEL_INDEX).is_file():
        found.append(f"{MODEL_INDEX} _class_name={diffusers_class(model_dir)!r}")
    if (model_dir / CONFIG).is_file():
        found.append(f"{CONFIG} model_type={transformers_type(model_dir)!r}")
    if (model_dir / REALTIME_CONFIG).is_file():
        pipeline = (read_json(model_dir / REALTIME_CONFIG) or {}).get("pipeline")
        found.append(f"{REALTIME_CONFIG} pipeline={pipeline!r}")
    if not found:
        return f"no {MODEL_INDEX}, {CONFIG} or {REALTIME_CONFIG}"
    return ", ".join(found)
