"""`POST /v1/responses` (the OpenAI Responses API subset of `client.responses.create`) on the
reasoner model: a translation into the chat completion path (api/streaming/responses.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from worldserve.api.errors import OpenAIRoute
from worldserve.api.schemas.responses import ResponsesRequest
from worldserve.api.services import ApiServices, chat_service
from worldserve.api.streaming.responses import ResponseView, response_events, to_chat
from worldserve.ipc.messages import ChatResult

router = APIRouter(route_class=OpenAIRoute, tags=["chat"])


def setup(services: ApiServices) -> bool:
    return services.chat is not None


@router.post("/v1/responses", response_model=None)
async def create_response(request: Request, body: ResponsesRequest) -> dict | StreamingResponse:
    service = chat_service(request)
    chat_body = to_chat(body)
    client = service.client()
    chat = await service.build(chat_body, client)
    replies = service.replies(chat, client)
    first = await anext(replies)  # stage errors (400, 503) keep their status
    view = ResponseView(body)
    if body.stream:
        return StreamingResponse(response_events(view, first, replies, body.include_reasoning),
                                 media_type="text/event-stream")
    result = first
    async for result in replies:
        pass
    assert isinstance(result, ChatResult)  # a non-streaming request gets exactly one result
    return view.final(result, body.include_reasoning)
