"""The prompt-enhancer file (`stages.generation.prompt_enhancer`): schema and loader.

Neutral ground: the generation stage validates the file at startup (an invalid file fails the
stage with the cause) and the api's enhancer (`api/jobs/enhancer.py`) uses it per request.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

DEFAULT_SYSTEM_PROMPT = ("Rewrite the user's prompt for a video generation model: one vivid, "
                         "concrete paragraph describing subject, motion, scene and camera. "
                         "Answer with the rewritten prompt only.")


class EnhancerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    base_url: str
    model: str | None = None
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    timeout: float = Field(default=30.0, gt=0, le=600)
    api_key_env: str | None = None

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        if value != "reasoner" and not value.startswith(("http://", "https://")):
            raise ValueError("must be 'reasoner' or an http(s) URL of an OpenAI-compatible API")
        return value.rstrip("/")


def load_enhancer_config(path: Path) -> EnhancerConfig:
    """Parse and validate the enhancer file; ValueError names the file and the problem."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read prompt_enhancer file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"prompt_enhancer file {path} is not valid YAML/JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"prompt_enhancer file {path} must hold a mapping")
    try:
        return EnhancerConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "<root>"
        raise ValueError(f"prompt_enhancer file {path}: {loc}: "
                         f"{first['msg'].removeprefix('Value error, ')}") from None
