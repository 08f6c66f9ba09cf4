"""Helpers every engine uses to find, name and load its model."""

from __future__ import annotations

from pathlib import Path

from worldserve.config import StageConfig
from worldserve.errors import InvalidRequest
from worldserve.ipc.messages import Request
from worldserve.models import registry
from worldserve.models.types import ModelLoadError

__all__ = ["ModelLoadError", "model_dir", "served_model_name", "unsupported"]


def model_dir(stage_config: StageConfig) -> Path:
    path = stage_config.model_path
    if path is None:
        raise ModelLoadError("no model path configured (set model_path or --model-path)")
    path = path.expanduser().resolve()
    if not path.exists():
        raise ModelLoadError(f"model path {path} does not exist")
    if not path.is_dir():
        raise ModelLoadError(f"model path {path} is not a directory")
    return path


def served_model_name(stage_config: StageConfig, path: Path) -> str:
    """Configured name, else the dev marker's name, else the directory name."""
    if stage_config.served_model_name:
        return stage_config.served_model_name
    name = (registry.dev_marker(path) or {}).get("served_model_name")
    return name if isinstance(name, str) and name else path.name


def unsupported(request: Request, stage: str) -> InvalidRequest:
    return InvalidRequest(f"stage '{stage}' does not handle {type(request).__name__} requests")
