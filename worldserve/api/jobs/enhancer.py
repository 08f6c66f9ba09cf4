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
from typing import Any

import httpx

from worldserve.enhancer_config import EnhancerConfig, load_enhancer_config
from worldserve.errors import InvalidRequest, RequestTimeout, UpstreamError

__all__ = ["EnhancerConfig", "PromptEnhancer", "load_enhancer_config", "maybe_enhance"]

MAX_ENHANCED_TOKENS = 256


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
        body = {
            "model": self.config.model,
            "max_tokens": MAX_ENHANCED_TOKENS,
            "temperature": 0,
            "messages": [
                {"role": "system", "content": self.config.system_prompt},
                {"role": "user", "content": prompt},
            ],
        }
        try:
            async with httpx.AsyncClient(timeout=self.config.timeout) as client:
                resp = await client.post(
                    f"{self.config.base_url}/chat/completions", json=body, headers=headers
                )
        except httpx.TimeoutException:
            raise RequestTimeout(
                f"prompt enhancer did not answer within {self.config.timeout:g} s"
            ) from None
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

        msg = ChatCompletion(
            request_id=new_request_id("enhance"),
            messages=[
                ChatMessage(
                    role="system", parts=[ChatPart(type="text", text=self.config.system_prompt)]
                ),
                ChatMessage(role="user", parts=[ChatPart(type="text", text=prompt)]),
            ],
            sampling=ReasonerSampling(max_tokens=MAX_ENHANCED_TOKENS, temperature=0.0),
        )
        try:
            reply = await self.runtime.client("reasoner").call(msg, timeout_s=self.config.timeout)
        except RequestTimeout:
            raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise UpstreamError(
                f"prompt enhancer (reasoner stage) failed: "
                f"{getattr(exc, 'code', type(exc).__name__)}"
            ) from None
        return getattr(reply, "text", "")


async def maybe_enhance(enhancer: PromptEnhancer | None, enabled: bool | None, prompt: str) -> str:
    if not enabled:
        return prompt
    if enhancer is None:
        raise InvalidRequest(
            "enhance_prompt needs a configured prompt enhancer (stages.generation.prompt_enhancer)",
            param="enhance_prompt",
        )
    return await enhancer.enhance(prompt)
