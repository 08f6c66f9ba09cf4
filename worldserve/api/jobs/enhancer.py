"""Prompt enhancement (`enhance_prompt: true`): placeholder until an enhancer is configured."""

from __future__ import annotations

from typing import Any

from worldserve.errors import InvalidRequest


async def maybe_enhance(service: Any, enabled: bool | None, prompt: str) -> str:
    if not enabled:
        return prompt
    raise InvalidRequest("enhance_prompt needs a configured prompt enhancer "
                         "(stages.generation.prompt_enhancer)", param="enhance_prompt")
