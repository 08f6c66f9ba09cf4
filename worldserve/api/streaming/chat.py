"""`ChatService`: one-shot OpenAI chat completions on the reasoner stage (stream and not).

Images come inline as base64 data URLs and pass the frame policy (JPEG/PNG, 8 MiB, 4 MP).
Remote http(s) image URLs are refused unless `allowed_media_domains` is configured; then they
are fetched by `worldserve.media.fetch` under that policy with the same byte limit. Local paths
and file:// URLs are read only inside `--allowed-local-media-path` (refused without it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from typing import Any, AsyncIterator

import msgspec

from worldserve.api.runtime import ServerRuntime
from worldserve.api.schemas.chat import ChatCompletionRequest, ChatMessageIn
from worldserve.api.streaming.images import check_frame
from worldserve.api.streaming.params import schema_text
from worldserve.api.streaming.service import reasoner_capabilities, reasoner_client
from worldserve.errors import (
    InvalidRequest,
    NotFound,
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
from worldserve.media.data_url import decode_data_url
from worldserve.media.fetch import fetch_remote, load_media
from worldserve.media.frame_limits import MAX_FRAME_BYTES
from worldserve.media.policy import MediaPolicy

# Chat defaults differ from the per-frame streaming defaults: OpenAI-style neutral sampling.
CHAT_DEFAULTS = {"max_tokens": 256, "temperature": 1.0, "top_p": 1.0, "repetition_penalty": 1.0}
JSON_OBJECT_SCHEMA = '{"type": "object"}'


class ChatService:
    def __init__(self, runtime: ServerRuntime) -> None:
        self.runtime = runtime
        self.timeout_s = runtime.config.stages.reasoner.streaming.frame_timeout_s
        # Remote images: only allowed hosts, each redirect re-checked, at most one frame's bytes.
        self.media_policy = dataclasses.replace(MediaPolicy.from_config(runtime.config),
                                                max_bytes=MAX_FRAME_BYTES)

    def client(self) -> StageClient:
        return reasoner_client(self.runtime, "chat")

    # ------------------------------------------------------------------ request building

    async def build(self, body: ChatCompletionRequest, client: StageClient) -> ChatCompletion:
        if body.model != client.info.model:
            raise NotFound(f"The model '{body.model}' does not exist; this server serves "
                           f"'{client.info.model}'", param="model")
        messages = [await self._message(m) for m in body.messages]
        return ChatCompletion(request_id=new_request_id("chatcmpl"), messages=messages,
                              sampling=self._sampling(body, client), stream=body.stream)

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
        }
        fields.update({k: v for k, v in given.items() if v is not None})
        return msgspec.convert(fields, ReasonerSampling)

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

    async def _message(self, message: ChatMessageIn) -> ChatMessage:
        if isinstance(message.content, str):
            part = ChatPart(type="text", text=message.content)
            return ChatMessage(role=message.role, parts=[part])
        parts = []
        for part in message.content:
            if part.type == "text":
                parts.append(ChatPart(type="text", text=part.text))
            else:
                if message.role != "user":
                    raise InvalidRequest(f"images are only allowed in user messages, not "
                                         f"{message.role!r}", param="messages")
                parts.append(ChatPart(type="image", image=await self._image(part.image_url.url)))
        return ChatMessage(role=message.role, parts=parts)

    async def _image(self, url: str) -> bytes:
        if url.startswith("data:"):
            data = decode_data_url(url, field="image_url", base64_only=True)[1]
        elif url.startswith(("http://", "https://")):
            data = await self._fetch(url)
        elif url[:5].lower() == "file:" or "://" not in url:
            # a local path: only inside --allowed-local-media-path (refused without it)
            data = await load_media(url, self.media_policy, "image_url")
        else:
            raise InvalidRequest(f"unsupported image URL scheme in {url[:40]!r}; send a data URL "
                                 "(data:image/jpeg;base64,...)", param="image_url")
        check_frame(data)
        return data

    async def _fetch(self, url: str) -> bytes:
        if not self.media_policy.allowed_domains:
            raise InvalidRequest("remote image URLs are not supported by this server; send the "
                                 "image inline as a data URL (data:image/jpeg;base64,...) or "
                                 "configure allowed_media_domains", param="image_url")
        return await fetch_remote(url, self.media_policy)

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


def completion_body(request_id: str, model: str, result: ChatResult) -> dict[str, Any]:
    return {
        "id": request_id, "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": result.text},
                     "finish_reason": result.finish_reason, "logprobs": None}],
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


async def sse_events(first: Reply, rest: AsyncIterator[Reply],
                     model: str, include_usage: bool) -> AsyncIterator[str]:
    """SSE body: role chunk, content deltas, finish chunk, optional usage chunk, `[DONE]`."""
    writer = ChunkWriter(f"chatcmpl-{uuid.uuid4().hex}", model)
    yield writer.delta({"role": "assistant", "content": ""})
    reply: Reply | None = first
    try:
        while reply is not None:
            if isinstance(reply, ChatDelta):
                yield writer.delta({"content": reply.text})
            elif isinstance(reply, ChatResult):
                yield writer.delta({}, reply.finish_reason)
                if include_usage:
                    yield writer.event([], usage=usage(reply))
            reply = await anext(rest, None)
    except WorldserveError as exc:  # headers are sent: report in-band like OpenAI-style servers
        yield f"data: {json.dumps(error_body(exc))}\n\n"
    yield "data: [DONE]\n\n"
