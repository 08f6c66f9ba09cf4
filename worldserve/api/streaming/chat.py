"""`ChatService`: one-shot OpenAI chat completions on the reasoner stage (stream and not).

Media parts (`image_url`, `video_url`) are read by `ChatMediaReader` (api/streaming/
chat_media.py) under the media policy. Omitted sampling fields take the Cosmos3 Reasoner NIM's
defaults (temperature 0.7, top_p 0.8, top_k 20); `max_tokens` beyond the room the prompt leaves
is lowered by the stage (vLLM's rule). A reply's reasoning block comes back as
`reasoning_content` (dropped with `include_reasoning: false`).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, AsyncIterator

import msgspec

from worldserve.api.model_names import served_model
from worldserve.api.runtime import ServerRuntime
from worldserve.api.schemas.chat import ChatCompletionRequest, ChatMessageIn, MediaIO
from worldserve.api.streaming.chat_media import ChatMediaReader
from worldserve.api.streaming.params import schema_text
from worldserve.api.streaming.service import reasoner_capabilities, reasoner_client
from worldserve.errors import (
    InvalidRequest,
    RequestTimeout,
    WorldserveError,
    error_body,
)
from worldserve.ipc.client import StageClient, new_request_id
from worldserve.ipc.messages import (
    ChatCompletion,
    ChatDelta,
    ChatMessage,
    ChatPart,
    ChatResult,
    ReasonerSampling,
    Reply,
)

# Chat defaults differ from the per-frame streaming defaults: the Reasoner NIM's (reasoning.md
# "Advanced sampling"); max_tokens when omitted: 256.
CHAT_DEFAULTS = {"max_tokens": 256, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
                 "repetition_penalty": 1.0}
JSON_OBJECT_SCHEMA = '{"type": "object"}'


class ChatService:
    def __init__(self, runtime: ServerRuntime) -> None:
        self.runtime = runtime
        self.timeout_s = runtime.config.stages.reasoner.streaming.frame_timeout_s
        self.media = ChatMediaReader(runtime)

    def client(self) -> StageClient:
        return reasoner_client(self.runtime, "chat")

    # ------------------------------------------------------------------ request building

    async def build(self, body: ChatCompletionRequest, client: StageClient) -> ChatCompletion:
        served_model(self.runtime, body.model, ("reasoner",))
        messages = [await self._message(m, body.media_io_kwargs) for m in body.messages]
        return ChatCompletion(request_id=new_request_id("chatcmpl"), messages=messages,
                              sampling=self._sampling(body, client), stream=body.stream,
                              template_kwargs=dict(body.chat_template_kwargs or {}),
                              thinking_token_budget=body.thinking_token_budget)

    def _sampling(self, body: ChatCompletionRequest, client: StageClient) -> ReasonerSampling:
        fields = {**msgspec.to_builtins(reasoner_capabilities(client).sampling), **CHAT_DEFAULTS}
        given = {
            "max_tokens": body.max_completion_tokens or body.max_tokens,
            "temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k,
            "frequency_penalty": body.frequency_penalty,
            "presence_penalty": body.presence_penalty,
            "repetition_penalty": body.repetition_penalty, "seed": body.seed,
            "stop": [body.stop] if isinstance(body.stop, str) else body.stop,
            "guided_choice": body.guided_choice, "guided_regex": body.guided_regex,
            "guided_json": self._guided_json(body),
            "min_tokens": body.min_tokens, "ignore_eos": body.ignore_eos,
        }
        fields.update({k: v for k, v in given.items() if v is not None})
        sampling = msgspec.convert(fields, ReasonerSampling)
        if sampling.min_tokens > sampling.max_tokens:
            raise InvalidRequest(f"min_tokens ({sampling.min_tokens}) must be at most max_tokens "
                                 f"({sampling.max_tokens})", param="min_tokens")
        return sampling

    @staticmethod
    def _guided_json(body: ChatCompletionRequest) -> str | None:
        fmt = body.response_format
        if fmt is not None and fmt.type == "json_schema":
            return schema_text(fmt.json_schema.schema_, "response_format.json_schema.schema",
                               "response_format")
        if fmt is not None and fmt.type == "json_object":
            return JSON_OBJECT_SCHEMA
        if body.guided_json is None:
            return None
        return schema_text(body.guided_json, "guided_json", "guided_json")

    async def _message(self, message: ChatMessageIn, media_io: MediaIO | None) -> ChatMessage:
        if isinstance(message.content, str):
            part = ChatPart(type="text", text=message.content)
            return ChatMessage(role=message.role, parts=[part])
        parts = []
        for part in message.content:
            if part.type == "text":
                parts.append(ChatPart(type="text", text=part.text))
                continue
            if message.role != "user":
                raise InvalidRequest(f"images and videos are only allowed in user messages, "
                                     f"not {message.role!r}", param="messages")
            if part.type == "image_url":
                parts.append(await self.media.image(part.image_url.url))
            else:
                video_io = media_io.video if media_io is not None else None
                parts.append(await self.media.video(part.video_url.url, video_io))
        return ChatMessage(role=message.role, parts=parts)

    # ------------------------------------------------------------------ running

    async def replies(self, request: ChatCompletion, client: StageClient) -> AsyncIterator[Reply]:
        """The stage's replies, each within the timeout; cancels the request if abandoned."""
        stream = await client.stream(request)
        iterator = stream.__aiter__()
        try:
            while True:
                try:
                    reply = await asyncio.wait_for(iterator.__anext__(), self.timeout_s)
                except StopAsyncIteration:
                    return
                except asyncio.TimeoutError:
                    raise RequestTimeout(f"the chat completion did not progress within "
                                         f"{self.timeout_s:g} s") from None
                yield reply
        finally:
            stream.cancel()


def completion_body(request_id: str, model: str, result: ChatResult,
                    include_reasoning: bool = True) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": result.text}
    if include_reasoning and result.reasoning is not None:
        message["reasoning_content"] = result.reasoning
    return {
        "id": request_id, "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": result.finish_reason,
                     "logprobs": None}],
        "usage": usage(result),
    }


def usage(result: ChatResult) -> dict[str, int]:
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens}


class ChunkWriter:
    """`chat.completion.chunk` SSE events of one completion."""

    def __init__(self, request_id: str, model: str) -> None:
        self.base = {"id": request_id, "object": "chat.completion.chunk",
                     "created": int(time.time()), "model": model}

    def event(self, choices: list[dict[str, Any]], **extra: Any) -> str:
        return f"data: {json.dumps({**self.base, 'choices': choices, **extra})}\n\n"

    def delta(self, delta: dict[str, Any], finish_reason: str | None = None) -> str:
        return self.event([{"index": 0, "delta": delta, "finish_reason": finish_reason,
                            "logprobs": None}])


def delta_fields(reply: ChatDelta, include_reasoning: bool) -> dict[str, str]:
    """The delta object of one `ChatDelta`: `content` and/or `reasoning_content`."""
    out = {}
    if reply.reasoning and include_reasoning:
        out["reasoning_content"] = reply.reasoning
    if reply.text:
        out["content"] = reply.text
    return out


async def sse_events(first: Reply, rest: AsyncIterator[Reply], model: str, include_usage: bool,
                     include_reasoning: bool = True) -> AsyncIterator[str]:
    """SSE body: role chunk, content (and reasoning) deltas, finish chunk, optional usage
    chunk, `[DONE]`."""
    writer = ChunkWriter(f"chatcmpl-{uuid.uuid4().hex}", model)
    yield writer.delta({"role": "assistant", "content": ""})
    reply: Reply | None = first
    try:
        while reply is not None:
            if isinstance(reply, ChatDelta):
                fields = delta_fields(reply, include_reasoning)
                if fields:
                    yield writer.delta(fields)
            elif isinstance(reply, ChatResult):
                yield writer.delta({}, reply.finish_reason)
                if include_usage:
                    yield writer.event([], usage=usage(reply))
            reply = await anext(rest, None)
    except WorldserveError as exc:  # headers are sent: report in-band like OpenAI-style servers
        yield f"data: {json.dumps(error_body(exc))}\n\n"
    yield "data: [DONE]\n\n"
