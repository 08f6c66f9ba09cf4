"""Where a ServerConfig comes from: a YAML file, the environment (envs.py) and dotted-path
overrides (the CLI flags), applied in that order and validated once. Errors name the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from worldserve import envs
from worldserve.config.base import ConfigError
from worldserve.config.server import ServerConfig


def format_validation_error(err: ValidationError, sources: dict[str, str] | None = None) -> str:
    """One line per problem: `<dotted.path>: <message>`, plus `(from $VAR)` where an
    environment variable set the key."""
    lines = []
    for item in err.errors():
        path = ".".join(str(p) for p in item["loc"]) or "<root>"
        msg = item["msg"].removeprefix("Value error, ")
        source = (sources or {}).get(path)
        lines.append(f"{path}: {msg}" + (f" (from ${source})" if source else ""))
    return "; ".join(lines)


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        raise ConfigError(f"config file {path} is not valid YAML{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    node = tree
    *parents, leaf = dotted.split(".")
    for key in parents:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{key}: expected a mapping, got {type(child).__name__}")
        node = child
    node[leaf] = value


def build_config(data: dict[str, Any], overrides: dict[str, Any] | None = None) -> ServerConfig:
    """Validate `data` (YAML) with the environment's settings and then the dotted-path
    `overrides` (CLI flags) applied on top: flag > environment > YAML > default."""
    tree = dict(data)
    try:
        from_env = envs.config_settings()
    except envs.EnvSettingError as exc:
        raise ConfigError(f"invalid environment: {exc}") from None
    sources: dict[str, str] = {}
    for dotted, (value, variable) in from_env.items():
        _set_dotted(tree, dotted, value)
        sources[dotted] = variable
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(tree, dotted, value)
            sources.pop(dotted, None)
    try:
        return ServerConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(
            f"invalid configuration: {format_validation_error(exc, sources)}"
        ) from None


def load_config(path: Path | None, overrides: dict[str, Any] | None = None) -> ServerConfig:
    return build_config(read_yaml(path) if path else {}, overrides)
