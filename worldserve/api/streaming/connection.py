"""One `/v1/streaming/ws` connection: an explicit state machine that owns accept -> loop -> cleanup.

Messages are handled strictly in order (spec section 8.1). The first message creates the
session; later ones are frames (binary or `{"op": "frame"}`) or `{"op": "delete"}`. Non-fatal
errors leave the session unchanged; fatal ones end the connection with 1008 or 1011
(section 8.4). Dropping the socket releases the session.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from typing import Any

from pydantic import ValidationError
from starlette.websockets import WebSocket, WebSocketDisconnect

from worldserve.api.errors import WS_CLOSE_NORMAL, validation_message, ws_error
from worldserve.api.schemas.streaming import WsCreateMessage
from worldserve.api.streaming.images import check_frame, decode_b64_image, parse_json_object
from worldserve.api.streaming.service import StreamingService
from worldserve.api.streaming.sessions import StreamSession, StreamSessionState
from worldserve.errors import (
    IdleTimeout,
    InternalError,
    InvalidRequest,
    PayloadTooLarge,
    WorldserveError,
    ws_close_code,
)

log = logging.getLogger("worldserve.api.streaming")


class StreamConnectionState(enum.Enum):
    CONNECTING = "connecting"
    AWAITING_CREATE = "awaiting_create"
    ACTIVE = "active"
    CLOSED = "closed"


class FatalError(Exception):
    """Ends the connection after the error message is sent."""

    def __init__(self, error: WorldserveError) -> None:
        super().__init__(error.message)
        self.error = error


class StreamingConnection:
    def __init__(self, websocket: WebSocket, service: StreamingService) -> None:
        self.ws = websocket
        self.service = service
        self.state = StreamConnectionState.CONNECTING
        self.session: StreamSession | None = None

    async def run(self) -> None:
        await self.ws.accept()
        self.state = StreamConnectionState.AWAITING_CREATE
        try:
            await self._loop()
        except FatalError as fatal:
            await self._fail(fatal.error)
        except WebSocketDisconnect:
            pass
        except Exception:
            log.exception("streaming connection failed")
            await self._fail(InternalError("internal server error"))
        finally:
            await self._cleanup()

    async def _loop(self) -> None:
        while self.state != StreamConnectionState.CLOSED:
            message = await self._receive()
            if message["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(message.get("code", 1000))
            if self.state == StreamConnectionState.AWAITING_CREATE:
                await self._create(message)
            else:
                await self._handle(message)

    async def _receive(self) -> dict[str, Any]:
        """The next message, or a fatal 408 when the reaper expires the session first."""
        if self.session is None:
            return await self.ws.receive()
        receive = asyncio.ensure_future(self.ws.receive())
        expired = asyncio.ensure_future(self.session.expired.wait())
        done, _ = await asyncio.wait({receive, expired}, return_when=asyncio.FIRST_COMPLETED)
        if receive in done:
            expired.cancel()
            return receive.result()
        receive.cancel()
        raise FatalError(IdleTimeout("session idle timeout"))

    async def _create(self, message: dict[str, Any]) -> None:
        text = message.get("text")
        if text is None:
            raise FatalError(InvalidRequest("the first message must be a JSON text create "
                                            "message, not binary data"))
        try:
            obj = parse_json_object(text, "message")
            op = obj.get("op", "create")
            if op != "create":
                raise InvalidRequest(f"the first message must create the session; got op {op!r}")
            try:
                body = WsCreateMessage.model_validate(obj)
            except ValidationError as exc:
                raise InvalidRequest(validation_message(exc)[0]) from None
            self.session = await self.service.create(body, "ws", body.frame_format)
        except WorldserveError as exc:
            raise FatalError(exc) from None
        reply = {"op": "created", **self.service.created_view(self.session),
                 "frame_format": self.session.frame_format}
        await self.ws.send_json(reply)
        self.state = StreamConnectionState.ACTIVE

    async def _handle(self, message: dict[str, Any]) -> None:
        try:
            if message.get("bytes") is not None:
                await self._frame_bytes(message["bytes"], "binary")
                return
            obj = parse_json_object(message.get("text") or "", "message")
            op = obj.get("op")
            if op == "frame":
                await self._frame_bytes(obj.get("image_b64"), "base64")
            elif op == "delete":
                await self._delete()
            elif op == "create":
                raise InvalidRequest("session already created; close it and open a new "
                                     "connection to change its settings")
            else:
                raise InvalidRequest(f"unknown op {op!r}; expected 'frame' or 'delete'")
        except WorldserveError as exc:
            if isinstance(exc, (InvalidRequest, PayloadTooLarge)):  # the session is unchanged
                await self.ws.send_json(ws_error(exc, fatal=False))
            else:
                raise FatalError(exc) from None

    async def _frame_bytes(self, payload: Any, kind: str) -> None:
        session = self._session()
        if session.frame_format != kind:
            hint = ("send the raw JPEG/PNG bytes as a binary message" if session.frame_format ==
                    "binary" else 'send {"op": "frame", "image_b64": "<base64>"} as text')
            raise InvalidRequest(f"frame format mismatch: this session uses "
                                 f"{session.frame_format} frames; {hint}")
        image = payload if kind == "binary" else decode_b64_image(payload)
        check_frame(image)
        result = await self.service.frame(session, image)
        await self.ws.send_json({"op": "frame", **self.service.frame_view(result)})

    async def _delete(self) -> None:
        session = self._session()
        frames = await self.service.close(session)
        await self.ws.send_json({"op": "closed", "session_id": session.session_id,
                                 "frames": frames, "closed": True})
        self.state = StreamConnectionState.CLOSED
        await self.ws.close(WS_CLOSE_NORMAL)

    def _session(self) -> StreamSession:
        if self.session is None:
            raise InternalError("no session on an active connection")
        return self.session

    async def _fail(self, error: WorldserveError) -> None:
        if self.state == StreamConnectionState.CLOSED:
            return
        self.state = StreamConnectionState.CLOSED
        try:
            await self.ws.send_json(ws_error(error, fatal=True))
            await self.ws.close(ws_close_code(error))
        except (WebSocketDisconnect, RuntimeError):
            pass  # the peer left first

    async def _cleanup(self) -> None:
        self.state = StreamConnectionState.CLOSED
        session = self.session
        if session is not None and session.state not in (StreamSessionState.CLOSED,
                                                          StreamSessionState.CLOSING):
            try:
                await self.service.close(session)
            except WorldserveError as exc:
                log.warning("releasing session %s on disconnect failed: %s",
                            session.session_id, exc.message)

