"""`StreamingService`: create, feed and close live sessions on the reasoner stage.

REST routes and WebSocket connections both go through it, so they share admission, the
one-frame-in-flight rule, the frame timeout and the idle reaper (spec sections 4-7).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

import msgspec

from worldserve.api.model_names import listed_name
from worldserve.api.runtime import ServerRuntime
from worldserve.api.schemas.streaming import CreateSessionBody
from worldserve.api.streaming.params import (
    SAMPLING_VIEW_FIELDS,
    build_retention,
    build_sampling,
    retention_view,
    sampling_view,
)
from worldserve.api.streaming.sessions import (
    SessionRegistry,
    StreamSession,
    StreamSessionState,
    Transport,
)
from worldserve.errors import (
    CapacityExceeded,
    Conflict,
    NotFound,
    NotSupported,
    RequestTimeout,
    StageUnavailable,
    WorldserveError,
    http_status,
)
from worldserve.ipc.capabilities import ReasonerCapabilities, capabilities_as
from worldserve.ipc.client import StageClient, new_request_id
from worldserve.ipc.messages import (
    Cancel,
    CloseSession,
    CreateSession,
    FrameResult,
    SessionCreated,
    SessionFrame,
)
from worldserve.media.frame_limits import MAX_FRAME_BYTES, MAX_FRAME_PIXELS

log = logging.getLogger("worldserve.api.streaming")

STAGE = "reasoner"
CREATE_TIMEOUT_S = 60.0
RELEASE_TIMEOUT_S = 10.0
CLOSE_WAIT_S = 10.0  # a delete waits this long for the frame in flight (spec section 7.1)
SHUTDOWN_CLOSE_WAIT_S = 1.0  # on shutdown, a frame in flight gets this long, then is aborted

BUSY = "session busy: a frame is already being processed"
UNUSABLE = "session is no longer usable; create a new session"
CLOSED = "session was closed"


def reasoner_client(runtime: ServerRuntime, feature: str) -> StageClient:
    """The ready reasoner stage (503 while down or loading) that supports `feature` (else 501)."""
    client = runtime.client(STAGE)
    if client.state != "ready" or client.info is None:
        raise StageUnavailable(f"the reasoning stage is not ready (state '{client.state}'); "
                               "retry later", stage=STAGE)
    caps = reasoner_capabilities(client)
    if not (caps.streaming if feature == "streaming" else caps.chat):
        raise NotSupported(f"{feature} is unavailable: the '{caps.backend}' reasoner backend does "
                           "not support it")
    return client


def reasoner_capabilities(client: StageClient) -> ReasonerCapabilities:
    info = client.info
    return capabilities_as(info.capabilities if info else None, ReasonerCapabilities)


class StreamingService:
    def __init__(self, runtime: ServerRuntime) -> None:
        self.runtime = runtime
        self.config = runtime.config.stages.reasoner.streaming
        self.registry = SessionRegistry(self._release, self.config.reaper_interval_s)

    def client(self) -> StageClient:
        return reasoner_client(self.runtime, "streaming")

    # ------------------------------------------------------------------ views

    def config_view(self) -> dict[str, Any]:
        client = self.client()
        caps = reasoner_capabilities(client)
        max_sessions = caps.max_sessions if caps.max_sessions is not None else \
            self.config.max_sessions
        return {
            "model": client.info.model,
            "retention": msgspec.to_builtins(caps.retention),
            "sampling": {k: getattr(caps.sampling, k) for k in SAMPLING_VIEW_FIELDS},
            "limits": {
                "max_sessions": max_sessions,
                "max_frame_bytes": MAX_FRAME_BYTES, "max_frame_pixels": MAX_FRAME_PIXELS,
                "idle_timeout_s": self.config.idle_timeout_s,
                "rest_idle_timeout_s": self.config.rest_idle_timeout_s,
                "frame_timeout_s": self.config.frame_timeout_s,
                "image_budget": caps.image_budget,
                "encoder_capacity": caps.encoder_capacity,
                "max_model_len": caps.max_model_len,
            },
        }

    @staticmethod
    def created_view(session: StreamSession) -> dict[str, Any]:
        return {"session_id": session.session_id, "model": session.model, "fps": session.fps,
                "retention": retention_view(session.retention),
                "sampling": sampling_view(session.sampling)}

    @staticmethod
    def frame_view(result: FrameResult) -> dict[str, Any]:
        return {name: getattr(result, name) for name in result.__struct_fields__
                if name != "request_id"}

    # ------------------------------------------------------------------ lifecycle

    async def create(self, body: CreateSessionBody, transport: Transport,
                     frame_format: str | None = None) -> StreamSession:
        """Validation order of spec section 4.4; admission (400/503) is the stage's."""
        client = self.client()
        info = client.info
        if body.model is not None and listed_name(self.runtime, body.model) != info.model:
            raise NotFound(f"unknown model '{body.model}'", param="model")
        caps = reasoner_capabilities(client)
        retention = build_retention(body.retention, caps.retention, caps.library_retention)
        sampling = build_sampling(body.sampling, caps.sampling)
        await self.registry.reap_expired()
        request = CreateSession(request_id=new_request_id("create"),
                                session_id=f"sess-{uuid.uuid4()}{self.runtime.id_tag}",
                                system_prompt=body.system_prompt,
                                retention=retention, sampling=sampling, question=body.question)
        try:
            reply = await client.call(request, timeout_s=CREATE_TIMEOUT_S)
        except RequestTimeout:
            client.send_nowait(CloseSession(request_id=new_request_id("close"),
                                            session_id=request.session_id))
            raise
        except CapacityExceeded as exc:  # C1/C2 (the stage's): say when a slot should free
            exc.retry_after_s = self.registry.retry_after_s()
            raise
        assert isinstance(reply, SessionCreated)  # the stage protocol, not client input
        idle_s = (self.config.idle_timeout_s if transport == "ws"
                  else self.config.rest_idle_timeout_s)
        session = StreamSession(session_id=reply.session_id, transport=transport, model=info.model,
                          fps=body.fps, retention=reply.retention, sampling=reply.sampling,
                          idle_timeout_s=idle_s, frame_format=frame_format)
        self.registry.add(session)
        return session

    async def frame(self, session: StreamSession, image: bytes) -> FrameResult:
        """Run one checked frame; 409 when busy or dead, 504 (session dead) on timeout."""
        if session.state == StreamSessionState.DEAD:
            raise Conflict(UNUSABLE)
        if session.state == StreamSessionState.BUSY:
            raise Conflict(BUSY)
        if session.state != StreamSessionState.IDLE:
            raise Conflict(CLOSED)
        client = self.client()
        request = SessionFrame(request_id=new_request_id("frame"), session_id=session.session_id,
                               image=image, received_at=time.time())
        session.move(StreamSessionState.BUSY)  # a busy session is never reaped
        session.inflight_request_id = request.request_id
        task = asyncio.ensure_future(self._run_frame(client, session, request))
        session.inflight = task
        await asyncio.wait({task})
        if task.cancelled():
            raise Conflict(CLOSED)
        return task.result()

    async def _run_frame(self, client: StageClient, session: StreamSession,
                         request: SessionFrame) -> FrameResult:
        timeout_s = self.config.frame_timeout_s
        try:
            reply = await client.call(request, timeout_s=timeout_s)
        except RequestTimeout:
            await self._kill(session)
            raise RequestTimeout(f"frame processing timed out after {timeout_s:g} s; the session "
                                 "was closed") from None
        except NotFound:  # the stage no longer has the session
            await self._kill(session)
            raise Conflict(UNUSABLE) from None
        except WorldserveError as exc:
            if http_status(exc) >= 500:
                await self._kill(session)
            elif session.state == StreamSessionState.BUSY:
                session.move(StreamSessionState.IDLE)  # a 4xx frame leaves the session unchanged
            raise
        finally:
            session.inflight = None
        assert isinstance(reply, FrameResult)
        session.num_frames += 1
        session.touch()  # an answered frame refreshes the idle clock
        if session.state == StreamSessionState.BUSY:  # else a delete is waiting for this frame
            session.move(StreamSessionState.IDLE)
        return reply

    async def _kill(self, session: StreamSession) -> None:
        """Fail closed: the session answers 409 until deleted or expired (idle from now)."""
        if session.state == StreamSessionState.BUSY:
            session.move(StreamSessionState.DEAD)
            session.touch()
        await self._release(session)

    async def close(self, session: StreamSession, wait_s: float = CLOSE_WAIT_S) -> int:
        """Delete a session (waiting up to `wait_s` for its frame in flight, then aborting it);
        return the number of replies sent."""
        if session.state in (StreamSessionState.CLOSING, StreamSessionState.CLOSED):
            raise NotFound(f"session '{session.session_id}' not found; it was already closed")
        session.move(StreamSessionState.CLOSING)
        task = session.inflight
        if task is not None:
            done, _ = await asyncio.wait({task}, timeout=wait_s)
            if not done:
                task.cancel()
                self._send(Cancel(request_id=new_request_id("cancel"),
                                  target_id=session.inflight_request_id or ""))
        self.registry.remove(session)
        session.move(StreamSessionState.CLOSED)
        await self._release(session)
        return session.num_frames

    async def close_all(self, wait_s: float = SHUTDOWN_CLOSE_WAIT_S) -> int:
        """Delete every live session at once (shutdown); return how many were closed."""
        live = [s for s in self.registry.sessions()
                if s.state not in (StreamSessionState.CLOSING, StreamSessionState.CLOSED)]
        await asyncio.gather(*(self.close(s, wait_s) for s in live), return_exceptions=True)
        if live:
            log.info("deleted %d streaming session(s) on shutdown", len(live))
        return len(live)

    async def _release(self, session: StreamSession) -> None:
        """Tell the stage to drop the session's cache (once; a down stage has dropped it)."""
        if session.released:
            return
        session.released = True
        client = self.runtime.clients.get(STAGE)
        if client is None or client.down_reason is not None:
            return
        try:
            await client.call(CloseSession(request_id=new_request_id("close"),
                                           session_id=session.session_id),
                              timeout_s=RELEASE_TIMEOUT_S)
        except WorldserveError as exc:
            log.warning("releasing session %s failed: %s", session.session_id, exc.message)

    def _send(self, request: Cancel) -> None:
        client = self.runtime.clients.get(STAGE)
        if client is not None:
            client.send_nowait(request)
