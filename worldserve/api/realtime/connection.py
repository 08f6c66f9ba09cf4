"""One realtime WebSocket as an explicit state machine (spec realtime-video §1).

accept -> wait until the realtime stage is warm -> read `init` messages until one is valid
-> admission -> generate loop ║ event listener ║ watchdog (the first to finish ends the
session) -> close -> cleanup (cancel the tasks, release the session's state in the stage,
release the admission slot). Cleanup runs on every exit path.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

import msgpack
from pydantic import ValidationError
from starlette.websockets import WebSocket, WebSocketDisconnect

from worldserve.api.realtime.admission import AdmissionRejected, Lease
from worldserve.api.realtime.cadence import CadenceTracker
from worldserve.api.realtime.chunks import open_session, request_chunk
from worldserve.api.realtime.controls import ScriptUpdate, SessionControls
from worldserve.api.realtime.events import EventApplier, InvalidEvent, parse_event
from worldserve.api.realtime.sender import (
    ChunkSender,
    ClientGone,
    GeneratedChunk,
    Pacer,
    SocketWriter,
    receive_or_gone,
)
from worldserve.api.realtime.service import RealtimeConnectionSettings, RealtimeService
from worldserve.api.realtime.tasks import stop_all
from worldserve.api.schemas.realtime import InitRequest
from worldserve.errors import (
    InvalidRequest,
    StageUnavailable,
    WorldserveError,
    public_message,
)
from worldserve.ipc.capabilities import RealtimeCapabilities
from worldserve.media.framing import ChunkEncoder, unpack
from worldserve.media.policy import check_forbidden_fields, check_prompt_lengths

log = logging.getLogger("worldserve.realtime")

MAX_INVALID_INITS = 8
WATCHDOG_POLL_S = 1.0


class RealtimeConnectionState(enum.Enum):
    ACCEPTED = "accepted"
    WAITING_WARM = "waiting_warm"
    AWAITING_INIT = "awaiting_init"
    ADMITTING = "admitting"
    STREAMING = "streaming"
    CLOSING = "closing"
    CLOSED = "closed"


_S = RealtimeConnectionState
_TRANSITIONS: dict[RealtimeConnectionState, frozenset[RealtimeConnectionState]] = {
    _S.ACCEPTED: frozenset({_S.WAITING_WARM, _S.CLOSING}),
    _S.WAITING_WARM: frozenset({_S.AWAITING_INIT, _S.CLOSING}),
    _S.AWAITING_INIT: frozenset({_S.ADMITTING, _S.CLOSING}),
    _S.ADMITTING: frozenset({_S.STREAMING, _S.CLOSING}),
    _S.STREAMING: frozenset({_S.CLOSING}),
    _S.CLOSING: frozenset({_S.CLOSED}),
    _S.CLOSED: frozenset(),
}


@dataclass(frozen=True)
class CloseDecision:
    code: int
    reason: str


GENERATION_COMPLETE = CloseDecision(1000, "generation complete")
IDLE_TIMEOUT = CloseDecision(1000, "session idle timeout")
LIFETIME_REACHED = CloseDecision(1000, "maximum session lifetime reached")
NO_VALID_INIT = CloseDecision(1008, "no valid init")
GENERATION_ERROR = CloseDecision(1011, "generation error")


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0]


class RealtimeConnection:
    """Owns one socket from accept to cleanup."""

    def __init__(self, websocket: WebSocket, service: RealtimeService) -> None:
        self.websocket = websocket
        self.service = service
        self.writer = SocketWriter(websocket)
        self.state = RealtimeConnectionState.ACCEPTED
        self.settings: RealtimeConnectionSettings | None = None
        self.lease: Lease | None = None
        self.controls: SessionControls | None = None
        self.cadence: CadenceTracker | None = None
        self.last_activity = time.monotonic()
        self.trace_id = websocket.query_params.get("trace_id") or f"trace-{uuid.uuid4().hex}"

    def _enter(self, state: RealtimeConnectionState) -> None:
        if state not in _TRANSITIONS[self.state]:
            raise RuntimeError(f"illegal realtime connection transition {self.state.value} -> "
                               f"{state.value}")
        self.state = state

    # ------------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        await self.websocket.accept()
        decision: CloseDecision | None = None
        try:
            decision = await self._run()
        except ClientGone:
            decision = None  # the client closed or vanished: nothing to send
        except Exception:
            log.exception("realtime session %s failed", self._session_id())
            decision = GENERATION_ERROR
        finally:
            if self.state != RealtimeConnectionState.CLOSING:
                self._enter(RealtimeConnectionState.CLOSING)
            try:
                await self._close(decision)
            finally:
                await self._cleanup()
                self._enter(RealtimeConnectionState.CLOSED)

    async def _run(self) -> CloseDecision:
        self._enter(RealtimeConnectionState.WAITING_WARM)
        try:
            await self.service.wait_ready()
            facts = self.service.facts()
        except StageUnavailable as exc:
            await self.writer.send_error("realtime stage unavailable", exc.code,
                                         public_message(exc))
            return CloseDecision(1011, "realtime stage unavailable")
        if not facts.realtime_supported:
            await self.writer.send_error(
                f"realtime video is not supported for pipeline {facts.pipeline}",
                "unsupported_pipeline")
            return CloseDecision(1008, "realtime video is not supported")
        self._enter(RealtimeConnectionState.AWAITING_INIT)
        settings = await self._await_init(facts)
        if settings is None:
            return NO_VALID_INIT
        self.cadence = CadenceTracker("sglang", settings.fps,
                                      self.service.runtime.metrics.realtime_cadence)
        self._enter(RealtimeConnectionState.ADMITTING)
        try:
            self.lease = await self.service.admission.acquire(settings.user, settings.kv_bytes)
        except AdmissionRejected as exc:
            extra = {"retry_after_s": exc.retry_after_s} if exc.retry_after_s else {}
            await self.writer.send_error(f"realtime admission rejected: {exc.reason}",
                                         "admission_rejected", exc.detail, **extra)
            return CloseDecision(1008, exc.reason)
        self._enter(RealtimeConnectionState.STREAMING)
        self.settings = settings
        log.info("realtime session %s started (user %s, %dx%d, %s)", settings.session_id,
                 settings.user, settings.width, settings.height, settings.encode.fmt)
        return await self._stream(settings, facts)

    async def _close(self, decision: CloseDecision | None) -> None:
        if decision is None:
            return
        try:
            await self.websocket.close(decision.code, decision.reason)
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass  # the client is already gone; nothing left to tell it

    async def _cleanup(self) -> None:
        if self.settings is not None:
            await self.service.release_session(self.settings.session_id)
            log.info("realtime session %s ended", self.settings.session_id)
            self.settings = None  # drops the in-memory first frame (no temp files are written)
        if self.lease is not None:
            await self.service.admission.release(self.lease)
            self.lease = None

    def _session_id(self) -> str:
        return self.settings.session_id if self.settings else "(not started)"

    # ------------------------------------------------------------------ init

    def _user(self) -> str:
        ws = self.websocket
        user = ws.query_params.get("user_id") or ws.headers.get("x-user-id")
        if user:
            return user
        return ws.client.host if ws.client else "unknown"

    async def _receive(self) -> tuple[str, Any]:
        """('bytes', data) or ('text', str); raises ClientGone on disconnect."""
        message = await receive_or_gone(self.websocket)
        if message.get("bytes") is not None:
            return "bytes", message["bytes"]
        return "text", message.get("text") or ""

    async def _await_init(self, facts: RealtimeCapabilities) -> RealtimeConnectionSettings | None:
        deadline = time.monotonic() + self.service.config.init_timeout_s
        num_invalid = 0
        while num_invalid < MAX_INVALID_INITS:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                kind, data = await asyncio.wait_for(self._receive(), remaining)
            except asyncio.TimeoutError:
                return None
            try:
                init = _parse_init(kind, data)
                return await self.service.build_settings(init, facts, trace_id=self.trace_id,
                                                         user=self._user())
            except InvalidRequest as exc:
                num_invalid += 1
                await self.writer.send_error("invalid generate request", "invalid_init",
                                             public_message(exc))
        return None

    # ------------------------------------------------------------------ streaming

    async def _stream(self, settings: RealtimeConnectionSettings,
                      facts: RealtimeCapabilities) -> CloseDecision:
        self.controls = SessionControls(facts.min_pulse_items, facts.max_script_frames)
        if settings.initial_script is not None:
            self.controls.apply([ScriptUpdate(settings.initial_script)], None)
        applier = EventApplier(self.controls, facts.camera_conditioning, facts.max_script_frames,
                               settings.refresh_kv_default)
        sender = ChunkSender(self.writer, ChunkEncoder(settings.encode),
                             session_id=settings.session_id, trace_id=self.trace_id,
                             pacer=Pacer(settings.fps) if settings.pacing else None)
        generate = asyncio.create_task(self._generate_loop(settings, facts, sender))
        listen = asyncio.create_task(self._listen(applier))
        watchdog = asyncio.create_task(self._watchdog())
        tasks = [generate, watchdog, listen]  # priority order when several end together
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await stop_all(tasks)
        ended = [t for t in tasks if not t.cancelled()]  # stop_all ended every task
        return ended[0].result()

    async def _generate_loop(self, settings: RealtimeConnectionSettings,
                             facts: RealtimeCapabilities, sender: ChunkSender) -> CloseDecision:
        """Open the session, then chunk after chunk; chunk k+1 is requested while chunk k is
        written (one pending send)."""
        pending: asyncio.Task[Any] | None = None
        chunk_index = 0
        try:
            await self._open(settings)
            while settings.max_chunks is None or chunk_index < settings.max_chunks:
                out = await self._generate_chunk(settings, facts, chunk_index)
                if pending is not None:
                    await pending
                pending = asyncio.create_task(self._send(sender, out))
                if settings.pacing:  # paced sends are not overlapped with generation (§8)
                    await pending
                chunk_index += 1
            if pending is not None:
                await pending
            return GENERATION_COMPLETE
        except WorldserveError as exc:
            if pending is not None:
                await pending
            log.warning("realtime session %s: chunk %d failed: %s", settings.session_id,
                        chunk_index, exc.message)
            # An engine failure may quote a server path (an OS error): the client reads the
            # redacted message, as an HTTP client would (api/errors.py); the log keeps it whole.
            detail = public_message(exc)
            await self.writer.send_error(f"error during generate loop: {_first_line(detail)}",
                                         "generation_error", detail)
            return GENERATION_ERROR
        finally:
            if pending is not None and not pending.done():
                pending.cancel()

    async def _open(self, settings: RealtimeConnectionSettings) -> None:
        await open_session(self.service, settings)

    async def _generate_chunk(self, settings: RealtimeConnectionSettings,
                              facts: RealtimeCapabilities, chunk_index: int) -> GeneratedChunk:
        """Sample the controls (the actions that events queued) into one chunk request."""
        assert self.controls is not None  # set by _stream before the loop starts
        started = time.perf_counter()
        controls = self.controls.next_chunk(facts.frames_in_chunk(chunk_index))
        return await request_chunk(self.service, settings, controls, chunk_index, started)

    async def _send(self, sender: ChunkSender, out: GeneratedChunk) -> None:
        await sender.send(out)
        if self.cadence is not None:
            self.cadence.chunk_sent(len(out.frames))

    async def _listen(self, applier: EventApplier) -> CloseDecision:
        """Apply client events until the client goes away (raises ClientGone)."""
        while True:
            kind, data = await self._receive()
            self.last_activity = time.monotonic()
            try:
                if kind != "bytes":
                    raise InvalidEvent("text messages are invalid; send msgpack binary messages")
                try:
                    message = unpack(data)
                except (ValueError, TypeError, msgpack.UnpackException):
                    raise InvalidEvent("the message is not a msgpack map") from None
                applier.apply(parse_event(message))
            except InvalidEvent as exc:
                await self.writer.send_error("invalid event", "invalid_event", str(exc))

    async def _watchdog(self) -> CloseDecision:
        config = self.service.config
        started = time.monotonic()
        while True:
            now = time.monotonic()
            if now - self.last_activity >= config.idle_timeout_s:
                return IDLE_TIMEOUT
            if config.max_lifetime_s and now - started >= config.max_lifetime_s:
                return LIFETIME_REACHED
            wait = self.last_activity + config.idle_timeout_s - now
            if config.max_lifetime_s:
                wait = min(wait, started + config.max_lifetime_s - now)
            await asyncio.sleep(max(0.01, min(wait, WATCHDOG_POLL_S)))


def _parse_init(kind: str, data: Any) -> InitRequest:
    if kind != "bytes":
        raise InvalidRequest("text messages are invalid; send the init as a msgpack binary message")
    try:
        message = unpack(data)
    except (ValueError, TypeError, msgpack.UnpackException):
        raise InvalidRequest("the message is not a msgpack map") from None
    if not isinstance(message, dict) or message.get("type") != "init":
        raise InvalidRequest("expected a map with type 'init'")
    check_forbidden_fields(message)  # at any depth, JSON-encoded strings included
    check_prompt_lengths(message)
    try:
        return InitRequest.model_validate(message)
    except ValidationError as exc:
        parts = []
        for err in exc.errors()[:5]:
            loc = ".".join(str(p) for p in err.get("loc", ()))
            msg = err["msg"].removeprefix("Value error, ")
            parts.append(f"{loc}: {msg}" if loc else msg)
        raise InvalidRequest("; ".join(parts)) from None
