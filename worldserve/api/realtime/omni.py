"""One vLLM-Omni realtime video socket (`WS /v1/realtime/video`) as an explicit state machine.

accept -> wait until the realtime stage is warm -> one `session.start` (invalid: `error`, then
close 1008, as vLLM-Omni answers) -> admission -> `video.start` -> generate loop ║ control
listener (`session.interaction` / `ping` / `stop`) ║ watchdog -> `session.done` -> close ->
cleanup (cancel the tasks, release the session in the stage, free the admission slot).
Cleanup runs on every exit path, a vanished client included. The session itself (admission,
settings, controls, chunk requests) is the same machinery as the SGLang protocol's.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import time
import uuid
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from worldserve.api.realtime import omni_messages as wire
from worldserve.api.realtime.admission import AdmissionRejected, Lease
from worldserve.api.realtime.cadence import CadenceTracker
from worldserve.api.realtime.chunks import open_session, request_chunk
from worldserve.api.realtime.controls import ScriptUpdate, SessionControls
from worldserve.api.realtime.omni_mapping import (
    interaction_updates,
    omni_message,
    omni_param,
    start_to_init,
    transition_chunks,
)
from worldserve.api.realtime.omni_session import EventLedger
from worldserve.api.realtime.sender import ClientGone, GeneratedChunk, receive_or_gone
from worldserve.api.realtime.service import RealtimeConnectionSettings, RealtimeService
from worldserve.api.realtime.tasks import stop_all
from worldserve.errors import InvalidRequest, StageUnavailable, WorldserveError, public_message
from worldserve.ipc.capabilities import RealtimeCapabilities
from worldserve.media.fmp4 import FragmentedMP4Writer

log = logging.getLogger("worldserve.realtime")


class OmniState(enum.Enum):
    ACCEPTED = "accepted"
    AWAITING_START = "awaiting_start"
    STREAMING = "streaming"
    CLOSING = "closing"
    CLOSED = "closed"


_TRANSITIONS = {
    OmniState.ACCEPTED: {OmniState.AWAITING_START, OmniState.CLOSING},
    OmniState.AWAITING_START: {OmniState.STREAMING, OmniState.CLOSING},
    OmniState.STREAMING: {OmniState.CLOSING},
    OmniState.CLOSING: {OmniState.CLOSED},
    OmniState.CLOSED: set(),
}
DONE, STOPPED, INVALID, FAILED = (1000, "generation complete"), (1000, "session stopped"), \
    (1008, "invalid session.start"), (1011, "generation error")
LIFETIME_REACHED = (1000, "maximum session lifetime reached")
WRITE_SETTLE_S = 5.0  # a chunk being written when the session ends may finish first


class OmniRealtimeConnection:
    """Owns one socket from accept to cleanup."""

    def __init__(self, websocket: WebSocket, service: RealtimeService) -> None:
        self.websocket = websocket
        self.service = service
        self.state = OmniState.ACCEPTED
        self.request_id = f"video_stream-{uuid.uuid4().hex}"
        self.settings: RealtimeConnectionSettings | None = None
        self.lease: Lease | None = None
        self.controls: SessionControls | None = None
        self.ledger = EventLedger()
        self.progress_at = time.monotonic()  # a chunk sent or a ping (vLLM-Omni's stall clock)
        self.chunks_sent = 0
        self._lock = asyncio.Lock()
        self._writing: asyncio.Task[None] | None = None

    def _enter(self, state: OmniState) -> None:
        if state not in _TRANSITIONS[self.state]:
            raise RuntimeError(f"illegal transition {self.state.value} -> {state.value}")
        self.state = state

    # ------------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        await self.websocket.accept()
        close: tuple[int, str] | None = None
        try:
            close = await self._run()
        except ClientGone:
            close = None
        except Exception:
            log.exception("vLLM-Omni realtime session %s failed", self.request_id)
            close = FAILED
        finally:
            self._enter(OmniState.CLOSING)
            try:
                if close is not None:
                    await self.websocket.close(*close)
            except (WebSocketDisconnect, RuntimeError, OSError):
                pass  # the client is already gone
            finally:
                await self._cleanup()
                self._enter(OmniState.CLOSED)

    async def _run(self) -> tuple[int, str]:
        try:
            await asyncio.wait_for(self.service.wait_ready(),
                                   self.service.config.init_timeout_s)
            facts = self.service.facts()
        except (StageUnavailable, asyncio.TimeoutError) as exc:
            detail = public_message(exc) if isinstance(exc, StageUnavailable) else "not ready"
            await self._send(wire.error(f"realtime stage unavailable: {detail}",
                                        "stage_unavailable"))
            return 1011, "realtime stage unavailable"
        self._enter(OmniState.AWAITING_START)
        settings = await self._await_start(facts)
        if settings is None:
            return INVALID
        try:
            self.lease = await self.service.admission.acquire(settings.user, settings.kv_bytes)
        except AdmissionRejected as exc:
            extra = {"retry_after_s": exc.retry_after_s} if exc.retry_after_s else {}
            await self._send(wire.error(f"realtime admission rejected: {exc.detail}",
                                        "admission_rejected", request_id=self.request_id,
                                        **extra))
            return 1008, exc.reason
        self.settings = settings
        self._enter(OmniState.STREAMING)
        return await self._stream(settings, facts)

    async def _cleanup(self) -> None:
        if self.settings is not None:
            await self.service.release_session(self.settings.session_id)
            self.settings = None
        if self.lease is not None:
            await self.service.admission.release(self.lease)
            self.lease = None

    # ------------------------------------------------------------------ socket

    async def _send(self, obj: dict[str, Any], payload: bytes | None = None) -> None:
        """One JSON message (and its binary frame right after it, under the same lock)."""
        try:
            async with self._lock:
                await self.websocket.send_text(json.dumps(obj))
                if payload is not None:
                    await self.websocket.send_bytes(payload)
        except (WebSocketDisconnect, RuntimeError, OSError):
            raise ClientGone() from None

    async def _receive_json(self, limit_bytes: int) -> Any:
        """A JSON text message; InvalidMessage for a binary, oversized or malformed one."""
        message = await receive_or_gone(self.websocket)
        text = message.get("text")
        if text is None:
            raise wire.InvalidMessage("binary messages are invalid; send JSON text messages")
        if len(text) > limit_bytes:
            raise wire.InvalidMessage(f"message too large ({len(text)} > {limit_bytes} bytes)")
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            raise wire.InvalidMessage("Invalid JSON message") from None

    # ------------------------------------------------------------------ session.start

    async def _await_start(self, facts: RealtimeCapabilities) -> RealtimeConnectionSettings | None:
        try:
            message = await asyncio.wait_for(
                self._receive_json(wire.MAX_START_MESSAGE_BYTES),
                self.service.config.init_timeout_s)
            start = wire.parse_session_start(message)
            self._check_model(start.model)
            init = start_to_init(start, facts)
            settings = await self.service.build_settings(
                init, facts, trace_id=self.request_id, user=self._user(start.user))
        except asyncio.TimeoutError:
            await self._send(wire.error("Timeout waiting for session.start"))
            return None
        except wire.InvalidMessage as exc:
            await self._send(wire.error(exc.message, exc.code, param=exc.param))
            return None
        except InvalidRequest as exc:
            text = omni_message(public_message(exc), exc.param)
            await self._send(wire.error(f"Invalid session.start: {text}", "invalid_request",
                                        param=omni_param(exc.param)))
            return None
        await self._send(wire.video_start(self.request_id, self._config(message, settings)))
        return settings

    def _check_model(self, model: str | None) -> None:
        info = self.service.client().info
        served = info.model if info else None
        if model is not None and served and model != served:
            raise wire.InvalidMessage(f"Model mismatch: request specifies '{model}' but server "
                                      f"is running '{served}'.", "model")

    def _user(self, user: str | None) -> str:
        ws = self.websocket
        return user or ws.headers.get("x-user-id") or (ws.client.host if ws.client else "unknown")

    @staticmethod
    def _config(message: dict[str, Any], settings: RealtimeConnectionSettings) -> dict[str, Any]:
        """The accepted configuration: what the client sent, with the resolved size, fps and
        seed this session runs at."""
        config = {k: v for k, v in message.items() if k not in ("type", "format")}
        config.update(width=settings.width, height=settings.height,
                      size=f"{settings.width}x{settings.height}", fps=settings.fps,
                      seed=settings.seed)
        return config

    # ------------------------------------------------------------------ streaming

    async def _stream(self, settings: RealtimeConnectionSettings,
                      facts: RealtimeCapabilities) -> tuple[int, str]:
        self.controls = SessionControls(facts.min_pulse_items, facts.max_script_frames)
        if settings.initial_script is not None:
            self.controls.apply([ScriptUpdate(settings.initial_script)], None)
        cadence = CadenceTracker("vllm_omni", settings.fps,
                                 self.service.runtime.metrics.realtime_cadence)
        writer = FragmentedMP4Writer(settings.width, settings.height, settings.fps)
        tasks = [asyncio.create_task(self._generate_loop(settings, facts, cadence, writer)),
                 asyncio.create_task(self._watchdog()),
                 asyncio.create_task(self._listen(facts, settings))]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await stop_all(tasks)
            try:
                await self._settle_write()
            finally:
                writer.close()  # only once no write can still use it
        ended = [t for t in tasks if not t.cancelled()]  # stop_all ended every task
        close = ended[0].result()
        if close in (STOPPED, LIFETIME_REACHED):  # after the last chunk's pair, never between
            await self._send(wire.session_done(self.request_id, self.chunks_sent, True))
        return close

    async def _settle_write(self) -> None:
        """Let a chunk being written finish (its metadata and binary frame stay a pair)."""
        task, self._writing = self._writing, None
        if task is None:
            return
        if not task.done():
            await asyncio.wait([task], timeout=WRITE_SETTLE_S)
        if not task.done():
            task.cancel()
            await asyncio.wait([task])
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # ClientGone, typically

    async def _generate_loop(self, settings: RealtimeConnectionSettings,
                             facts: RealtimeCapabilities, cadence: CadenceTracker,
                             writer: FragmentedMP4Writer) -> tuple[int, str]:
        """Chunk k+1 is generated while chunk k is encoded and written (one pending send)."""
        pending: asyncio.Task[None] | None = None
        chunk_index = 0
        try:
            await open_session(self.service, settings)
            while settings.max_chunks is None or chunk_index < settings.max_chunks:
                out = await self._generate_chunk(settings, facts, chunk_index)
                if pending is not None:
                    await pending
                pending = self._writing = asyncio.create_task(self._write(writer, out, cadence))
                chunk_index += 1
            if pending is not None:
                await pending
        except WorldserveError as exc:
            if pending is not None:
                await pending
            log.warning("vLLM-Omni realtime %s: chunk %d failed: %s", self.request_id,
                        chunk_index, exc.message)
            # the redacted text, as the SGLang socket and HTTP send it (the log keeps it whole)
            await self._send(wire.error(f"generation failed: {public_message(exc)}",
                                        "generation_error",
                                        request_id=self.request_id))
            return FAILED
        await self._send(wire.session_done(self.request_id, self.chunks_sent, False))
        return DONE

    async def _generate_chunk(self, settings: RealtimeConnectionSettings,
                              facts: RealtimeCapabilities, chunk_index: int) -> GeneratedChunk:
        assert self.controls is not None  # set by _stream
        started = time.perf_counter()
        controls = self.controls.next_chunk(facts.frames_in_chunk(chunk_index))
        self.ledger.chunk_started(chunk_index)
        return await request_chunk(self.service, settings, controls, chunk_index, started)

    async def _write(self, writer: FragmentedMP4Writer, out: GeneratedChunk,
                     cadence: CadenceTracker) -> None:
        data = await asyncio.to_thread(writer.write, out.frames)  # CPU work off the loop
        started, active, completed = self.ledger.ids_for(out.chunk_index)
        await self._send(wire.chunk_metadata(
            self.request_id, transport_chunk_index=self.chunks_sent,
            generation_chunk_index=out.chunk_index, num_frames=len(out.frames),
            byte_length=len(data), started=started, active=active, completed=completed), data)
        self.chunks_sent += 1
        self.progress_at = time.monotonic()
        cadence.chunk_sent(len(out.frames))

    async def _listen(self, facts: RealtimeCapabilities,
                      settings: RealtimeConnectionSettings) -> tuple[int, str]:
        """Control messages until `session.stop` (or the client goes: ClientGone)."""
        while True:
            try:
                message = await self._receive_json(wire.MAX_CONTROL_MESSAGE_BYTES)
                kind = message.get("type") if isinstance(message, dict) else None
                if not isinstance(message, dict):
                    raise wire.InvalidMessage("WebSocket messages must be JSON objects")
                if kind == "session.stop":
                    return STOPPED
                if kind == "session.ping":
                    self.progress_at = time.monotonic()
                    await self._send({"type": "session.pong"})
                elif kind == "session.interaction":
                    await self._interaction(message, facts, settings)
                else:
                    raise wire.InvalidMessage(f"Unknown message type: {kind}", "type")
            except wire.InvalidMessage as exc:
                await self._send(wire.error(exc.message, exc.code, param=exc.param,
                                            request_id=self.request_id))

    async def _interaction(self, message: dict[str, Any], facts: RealtimeCapabilities,
                           settings: RealtimeConnectionSettings) -> None:
        assert self.controls is not None  # set by _stream
        interaction = message.get("interaction")
        if not isinstance(interaction, dict):
            raise wire.InvalidMessage("session.interaction requires an interaction object",
                                      "interaction")
        unknown = set(interaction) - {"event_id", "event", "transition_chunks"}
        if unknown:
            raise wire.InvalidMessage(f"interaction.{sorted(unknown)[0]} is not supported",
                                      f"interaction.{sorted(unknown)[0]}")
        raw_id = interaction.get("event_id")
        event_id = raw_id if isinstance(raw_id, str) and raw_id else None
        try:
            event_id = self.ledger.new_event_id(raw_id)
            transition_chunks(interaction.get("transition_chunks"))
            updates = interaction_updates(interaction.get("event"), facts,
                                          settings.refresh_kv_default)
        except wire.InvalidMessage as exc:
            await self._send(wire.error(exc.message, exc.code, param=exc.param,
                                        request_id=self.request_id, event_id=event_id))
            return
        self.controls.apply(updates, self.ledger.queue(event_id, updates))
        await self._send(wire.interaction_queued(self.request_id, event_id))

    async def _watchdog(self) -> tuple[int, str]:
        """vLLM-Omni's stall clock (no chunk and no ping for `idle_timeout_s`), and the
        server's session lifetime."""
        config = self.service.config
        started = time.monotonic()
        while True:
            now = time.monotonic()
            if now - self.progress_at >= config.idle_timeout_s:
                await self._send(wire.error("Stall timeout: no generation progress",
                                            "stall_timeout", request_id=self.request_id))
                return 1000, "stall timeout"
            if config.max_lifetime_s and now - started >= config.max_lifetime_s:
                return LIFETIME_REACHED
            await asyncio.sleep(0.25)

