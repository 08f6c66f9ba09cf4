"""`POST /v1/responses` as a thin translation into the chat completion path: the request becomes
a `ChatCompletionRequest` (instructions -> system message, `input_*` parts -> content parts,
`text.format` -> `response_format`, `max_output_tokens` -> `max_tokens`) served by `ChatService`;
the stage's replies become a `response` object, or the Responses API's SSE events
(`response.created` ... `response.output_text.delta` ... `response.completed`).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, AsyncIterator

from pydantic import ValidationError

from worldserve.api.errors import validation_message
from worldserve.api.schemas.chat import ChatCompletionRequest
from worldserve.api.schemas.responses import InputMessage, ResponsesRequest, TextFormat
from worldserve.errors import InvalidRequest, WorldserveError, public_message
from worldserve.ipc.messages import ChatDelta, ChatResult, Reply

EXTENSIONS = ("top_k", "repetition_penalty", "seed", "media_io_kwargs", "chat_template_kwargs",
              "include_reasoning", "thinking_token_budget", "temperature", "top_p", "user")


def to_chat(body: ResponsesRequest) -> ChatCompletionRequest:
    """The chat completion a Responses request asks for (400 when it breaks a chat rule)."""
    messages: list[dict[str, Any]] = []
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
    items = [InputMessage(role="user", content=body.input)] if isinstance(body.input, str) \
        else body.input
    messages += [_message(item) for item in items]
    chat = {"model": body.model, "messages": messages, "stream": body.stream,
            "max_tokens": body.max_output_tokens,
            "response_format": _response_format(body.text.format if body.text else None),
            **{name: getattr(body, name) for name in EXTENSIONS}}
    try:
        return ChatCompletionRequest.model_validate(chat)
    except ValidationError as exc:
        message, param = validation_message(exc)
        raise InvalidRequest(message, param=param) from None


def _message(item: InputMessage) -> dict[str, Any]:
    role = "system" if item.role == "developer" else item.role
    if isinstance(item.content, str):
        return {"role": role, "content": item.content}
    parts: list[dict[str, Any]] = []
    for part in item.content:
        if part.type == "input_image":
            parts.append({"type": "image_url",
                          "image_url": {"url": part.image_url, "detail": part.detail}})
        elif part.type == "input_video":
            parts.append({"type": "video_url", "video_url": {"url": part.video_url}})
        else:
            parts.append({"type": "text", "text": part.text})
    return {"role": role, "content": parts}


def _response_format(fmt: TextFormat | None) -> dict[str, Any] | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {
        "name": fmt.name or "response", "schema": fmt.schema_, "strict": fmt.strict}}


class ResponseView:
    """The `response` object of one request, in its states."""

    def __init__(self, body: ResponsesRequest) -> None:
        self.body = body
        self.id = f"resp_{uuid.uuid4().hex}"
        self.message_id = f"msg_{uuid.uuid4().hex}"
        self.reasoning_id = f"rs_{uuid.uuid4().hex}"
        self.created_at = int(time.time())

    def response(self, status: str, output: list[dict[str, Any]],
                 result: ChatResult | None = None) -> dict[str, Any]:
        body = self.body
        fmt = body.text.format if body.text and body.text.format else None
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": status, "error": None, "incomplete_details": incomplete,
            "model": body.model, "instructions": body.instructions, "output": output,
            "max_output_tokens": body.max_output_tokens, "temperature": body.temperature,
            "top_p": body.top_p, "parallel_tool_calls": False, "tool_choice": "none",
            "tools": [], "store": False, "metadata": body.metadata or {},
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True)
                     if fmt else {"type": "text"}},
            "usage": _usage(result) if result is not None else None,
        }

    def message(self, text: str, status: str = "completed") -> dict[str, Any]:
        return {"type": "message", "id": self.message_id, "status": status,
                "role": "assistant", "content": [_output_text(text)] if status == "completed"
                else []}

    def reasoning(self, text: str) -> dict[str, Any]:
        return {"type": "reasoning", "id": self.reasoning_id, "summary": [],
                "content": [{"type": "reasoning_text", "text": text}]}

    def final(self, result: ChatResult, include_reasoning: bool) -> dict[str, Any]:
        output = [self.message(result.text)]
        if include_reasoning and result.reasoning is not None:
            output.insert(0, self.reasoning(result.reasoning))
        status = "incomplete" if result.finish_reason == "length" else "completed"
        return self.response(status, output, result)


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _usage(result: ChatResult) -> dict[str, Any]:
    return {"input_tokens": result.prompt_tokens, "output_tokens": result.completion_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": result.reasoning_tokens}}


class EventWriter:
    """SSE events of one streamed response, numbered."""

    def __init__(self, view: ResponseView) -> None:
        self.view = view
        self.sequence = 0

    def __call__(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data)}\n\n"


async def response_events(view: ResponseView, first: Reply, rest: AsyncIterator[Reply],
                          include_reasoning: bool) -> AsyncIterator[str]:
    """The Responses API's event stream for one reply (errors in-band as an `error` event)."""
    emit = EventWriter(view)
    yield emit("response.created", response=view.response("in_progress", []))
    yield emit("response.in_progress", response=view.response("in_progress", []))
    items = _ItemStream(view, emit, include_reasoning)
    reply: Reply | None = first
    try:
        while reply is not None:
            if isinstance(reply, ChatDelta):
                for event in items.delta(reply):
                    yield event
            elif isinstance(reply, ChatResult):
                for event in items.finish(reply):
                    yield event
            reply = await _next(rest)
    except WorldserveError as exc:  # headers are sent: report in-band
        yield emit("error", code=exc.code, message=public_message(exc), param=exc.param)


async def _next(rest: AsyncIterator[Reply]) -> Reply | None:
    return await anext(rest, None)


class _ItemStream:
    """Output items as the deltas arrive: the reasoning item (index 0, when the reply has one),
    then the message item with one `output_text` part."""

    def __init__(self, view: ResponseView, emit: EventWriter, include_reasoning: bool) -> None:
        self.view, self.emit, self.include_reasoning = view, emit, include_reasoning
        self.reasoning: str | None = None  # None: no reasoning item opened
        self.reasoning_open = False
        self.text: str | None = None  # None: no message item opened

    def delta(self, reply: ChatDelta) -> list[str]:
        out: list[str] = []
        if reply.reasoning and self.include_reasoning and self.text is None:
            if self.reasoning is None:
                self.reasoning, self.reasoning_open = "", True
                out.append(self.emit("response.output_item.added", output_index=0,
                                     item={**self.view.reasoning(""), "content": []}))
            self.reasoning += reply.reasoning
            out.append(self.emit("response.reasoning_text.delta", item_id=self.view.reasoning_id,
                                 output_index=0, content_index=0, delta=reply.reasoning))
        if reply.text:
            out += self._open_message()
            self.text = (self.text or "") + reply.text
            out.append(self.emit("response.output_text.delta", item_id=self.view.message_id,
                                 output_index=self._message_index(), content_index=0,
                                 delta=reply.text, logprobs=[]))
        return out

    def finish(self, result: ChatResult) -> list[str]:
        out = self._open_message()
        index, text = self._message_index(), self.text or ""
        part = _output_text(text)
        out.append(self.emit("response.output_text.done", item_id=self.view.message_id,
                             output_index=index, content_index=0, text=text, logprobs=[]))
        out.append(self.emit("response.content_part.done", item_id=self.view.message_id,
                             output_index=index, content_index=0, part=part))
        out.append(self.emit("response.output_item.done", output_index=index,
                             item=self.view.message(text)))
        final = self.view.final(result, self.include_reasoning)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        out.append(self.emit(kind, response=final))
        return out

    def _message_index(self) -> int:
        return 0 if self.reasoning is None else 1

    def _open_message(self) -> list[str]:
        out: list[str] = []
        if self.reasoning_open:
            self.reasoning_open = False
            text = self.reasoning or ""
            out.append(self.emit("response.reasoning_text.done", item_id=self.view.reasoning_id,
                                 output_index=0, content_index=0, text=text))
            out.append(self.emit("response.output_item.done", output_index=0,
                                 item=self.view.reasoning(text)))
        if self.text is None:
            self.text = ""
            index = self._message_index()
            out.append(self.emit("response.output_item.added", output_index=index,
                                 item=self.view.message("", "in_progress")))
            out.append(self.emit("response.content_part.added", item_id=self.view.message_id,
                                 output_index=index, content_index=0, part=_output_text("")))
        return out
