"""`POST /v1/chat/completions` on the reasoner model (OpenAI shape; SSE when `stream`)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from worldserve.api.errors import OpenAIRoute
from worldserve.api.schemas.chat import ChatCompletionRequest
from worldserve.api.services import ApiServices, chat_service
from worldserve.api.streaming.chat import completion_body, sse_events
from worldserve.ipc.messages import ChatResult

router = APIRouter(route_class=OpenAIRoute, tags=["chat"])


def setup(services: ApiServices) -> bool:
    return services.chat is not None


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(request: Request,
                           body: ChatCompletionRequest) -> dict | StreamingResponse:
    service = chat_service(request)
    client = service.client()
    chat = await service.build(body, client)
    replies = service.replies(chat, client)
    # The first reply is awaited here so that stage errors (400, 503) keep their status.
    first = await anext(replies)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(sse_events(first, replies, body.model, include_usage,
                                            body.include_reasoning),
                                 media_type="text/event-stream")
    result = first
    async for result in replies:
        pass
    assert isinstance(result, ChatResult)  # a non-streaming request gets exactly one result
    return completion_body(chat.request_id, body.model, result, body.include_reasoning)
