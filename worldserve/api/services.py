"""The api's services, built once at startup by `create_app` (never on a request).

One typed attribute per surface; `None` when the surface is off (its routes are then not
registered). Building the media service opens the record store and recovers the jobs a
previous run left live; the app's lifespan starts its retention sweeper.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import AsyncIterator, TypeVar

from fastapi import FastAPI
from starlette.requests import HTTPConnection

from worldserve import envs
from worldserve.api.allocator import returning_free_pages
from worldserve.api.jobs.enhancer import PromptEnhancer, load_enhancer_config
from worldserve.api.jobs.service import MediaService
from worldserve.api.memtrace import memory_tracing
from worldserve.api.realtime.service import RealtimeService
from worldserve.api.runtime import ServerRuntime
from worldserve.api.sockets import OpenSockets
from worldserve.api.streaming.chat import ChatService
from worldserve.api.streaming.service import StreamingService
from worldserve.errors import InternalError

S = TypeVar("S")


@dataclass(frozen=True)
class ApiServices:
    media: MediaService | None = None
    streaming: StreamingService | None = None
    chat: ChatService | None = None
    realtime: RealtimeService | None = None
    # The open streaming and realtime WebSockets (closed with 1001 on shutdown).
    sockets: OpenSockets = field(default_factory=OpenSockets)

    async def before_shutdown(self) -> None:
        """Orderly shutdown, before the HTTP server drops its connections: every open WebSocket
        gets 1001 `server shutting down`, then the streaming sessions left (REST ones) are
        deleted, releasing their caches in the reasoner stage."""
        await self.sockets.close_all()
        if self.streaming is not None:
            await self.streaming.close_all()

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        """Background work that needs the event loop: the media retention sweeper, free heap
        pages handed back to the system (api/allocator.py), and the opt-in allocation tracing
        of a soak (api/memtrace.py)."""
        if self.media is not None:
            self.media.start_sweeper()
        async with returning_free_pages(), memory_tracing(envs.tracemalloc_dir(),
                                                          envs.tracemalloc_every_s()):
            yield


def build_services(runtime: ServerRuntime) -> ApiServices:
    """Every service of the enabled surfaces; the media service's shutdown joins the hooks."""
    reasoner = runtime.config.stages.reasoner
    media = _media_service(runtime) if "generation" in runtime.clients else None
    if media is not None:
        runtime.shutdown_hooks.append(media.shutdown)
    return ApiServices(
        media=media,
        streaming=StreamingService(runtime) if reasoner.enabled and reasoner.streaming.enabled
        else None,
        chat=ChatService(runtime) if reasoner.enabled else None,
        realtime=RealtimeService(runtime) if "realtime" in runtime.clients else None,
    )


def _media_service(runtime: ServerRuntime) -> MediaService:
    path = runtime.config.stages.generation.prompt_enhancer
    enhancer = PromptEnhancer(load_enhancer_config(path), runtime) if path is not None else None
    return MediaService(runtime, enhancer)


def services_of(connection: HTTPConnection) -> ApiServices:
    return connection.app.state.services


def _required(service: S | None, name: str) -> S:
    if service is None:  # routes of a disabled surface are never registered
        raise InternalError(f"the {name} service is not configured on this server")
    return service


def media_service(connection: HTTPConnection) -> MediaService:
    return _required(services_of(connection).media, "media")


def streaming_service(connection: HTTPConnection) -> StreamingService:
    return _required(services_of(connection).streaming, "streaming")


def chat_service(connection: HTTPConnection) -> ChatService:
    return _required(services_of(connection).chat, "chat")


def realtime_service(connection: HTTPConnection) -> RealtimeService:
    return _required(services_of(connection).realtime, "realtime")
