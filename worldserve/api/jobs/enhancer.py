"""Prompt enhancement (`enhance_prompt: true` -> `revised_prompt`).

The rewriter is the server's own reasoner stage (`base_url: reasoner`) or any OpenAI-compatible
chat endpoint, named in the file `stages.generation.prompt_enhancer` (YAML or JSON):

    base_url: http://127.0.0.1:9000/v1   # or "reasoner"
    model: my-rewriter
    system_prompt: Rewrite the prompt ...
    timeout: 20
    api_key_env: REWRITER_API_KEY        # optional: name of the variable holding the key

An invalid file makes the generation stage fail to start with the cause (the engine validates
it at load). A failing rewriter answers 502, a slow one 504; upstream bodies are never echoed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from worldserve.errors import InvalidRequest, RequestTimeout, UpstreamError

DEFAULT_SYSTEM_PROMPT = ("Rewrite the user's prompt for a video generation model: one vivid, "
                         "concrete paragraph describing subject, motion, scene and camera. "
                         "Answer with the rewritten prompt only.")
MAX_ENHANCED_TOKENS = 256


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


class PromptEnhancer:
    def __init__(self, config: EnhancerConfig, runtime: Any = None) -> None:
        self.config = config
        self.runtime = runtime

    async def enhance(self, prompt: str) -> str:
        if self.config.base_url == "reasoner":
            text = await self._via_reasoner(prompt)
        else:
            text = await self._via_http(prompt)
        text = (text or "").strip()
        if not text:
            raise UpstreamError("prompt enhancer returned an empty prompt")
        return text

    async def _via_http(self, prompt: str) -> str:
        headers = {}
        if self.config.api_key_env and os.environ.get(self.config.api_key_env):
            headers["Authorization"] = f"Bearer {os.environ[self.config.api_key_env]}"
        body = {"model": self.config.model, "max_tokens": MAX_ENHANCED_TOKENS, "temperature": 0,
                "messages": [{"role": "system", "content": self.config.system_prompt},
                             {"role": "user", "content": prompt}]}
        try:
            async with httpx.AsyncClient(timeout=self.config.timeout) as client:
                resp = await client.post(f"{self.config.base_url}/chat/completions", json=body,
                                         headers=headers)
        except httpx.TimeoutException:
            raise RequestTimeout(f"prompt enhancer did not answer within "
                                 f"{self.config.timeout:g} s") from None
        except httpx.HTTPError as exc:
            raise UpstreamError(f"prompt enhancer unreachable ({type(exc).__name__})") from None
        if resp.status_code != 200:
            raise UpstreamError(f"prompt enhancer failed (HTTP {resp.status_code})")
        try:
            return resp.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise UpstreamError("prompt enhancer sent a malformed response") from None

    async def _via_reasoner(self, prompt: str) -> str:
        import asyncio

        from worldserve.ipc.client import new_request_id
        from worldserve.ipc.messages import ChatCompletion, ChatMessage, ChatPart, ReasonerSampling

        msg = ChatCompletion(request_id=new_request_id("enhance"), messages=[
            ChatMessage(role="system", parts=[ChatPart(type="text", text=self.config.system_prompt)]),
            ChatMessage(role="user", parts=[ChatPart(type="text", text=prompt)])],
            sampling=ReasonerSampling(max_tokens=MAX_ENHANCED_TOKENS, temperature=0.0))
        try:
            reply = await self.runtime.client("reasoner").call(msg, timeout_s=self.config.timeout)
        except RequestTimeout:
            raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise UpstreamError(f"prompt enhancer (reasoner stage) failed: "
                                f"{getattr(exc, 'code', type(exc).__name__)}") from None
        return getattr(reply, "text", "")


async def maybe_enhance(enhancer: PromptEnhancer | None, enabled: bool | None,
                        prompt: str) -> str:
    if not enabled:
        return prompt
    if enhancer is None:
        raise InvalidRequest("enhance_prompt needs a configured prompt enhancer "
                             "(stages.generation.prompt_enhancer)", param="enhance_prompt")
    return await enhancer.enhance(prompt)
