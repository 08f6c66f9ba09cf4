"""The two transports of `worldserve stream` behind one interface: WebSocket and REST."""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass
from typing import Protocol

import httpx
from websockets.exceptions import ConnectionClosed, WebSocketException
from websockets.sync.client import ClientConnection, connect

from worldserve.clients.auth import bearer_headers
from worldserve.clients.stream_common import (
    CLOSE_TIMEOUT_S,
    FRAME_TIMEOUT_S,
    PREFLIGHT_TIMEOUT_S,
    SESSIONS_PATH,
    WS_PATH,
    CleanupError,
    StreamError,
    StreamOptions,
)


@dataclass(frozen=True)
class FrameError:
    """A failed frame: `fatal` ends the stream."""

    code: int | None
    message: str
    fatal: bool


class Transport(Protocol):
    """One session over one transport: open → send* → close (close is always called)."""

    def open(self, body: dict) -> dict: ...

    def send(self, jpeg: bytes) -> dict | FrameError: ...

    def close(self) -> int | None: ...


def websocket_url(base_url: str) -> str:
    scheme, rest = base_url.split("://", 1)
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest}{WS_PATH}"


class WebSocketTransport:
    """One connection owns one session (spec §8)."""

    def __init__(self, base_url: str, frame_format: str, api_key: str | None = None) -> None:
        self.url = websocket_url(base_url)
        self.frame_format = frame_format
        self.headers = bearer_headers(api_key)
        self.ws: ClientConnection | None = None
        self.frames_answered = 0  # the local count `closed after` falls back on (spec §14.6)

    def open(self, body: dict) -> dict:
        try:
            self.ws = connect(self.url, max_size=None, open_timeout=PREFLIGHT_TIMEOUT_S,
                              additional_headers=self.headers)
            self.ws.send(json.dumps({"op": "create", "frame_format": self.frame_format, **body}))
            reply = json.loads(self.ws.recv(timeout=PREFLIGHT_TIMEOUT_S))
        except (OSError, WebSocketException, TimeoutError, ValueError) as exc:
            raise StreamError(f"session create failed: {exc}") from exc
        if not isinstance(reply, dict) or reply.get("op") != "created":
            raise StreamError(f"session create failed: {reply}")
        return reply

    def send(self, jpeg: bytes) -> dict | FrameError:
        assert self.ws is not None, "open() first"
        try:
            if self.frame_format == "binary":
                self.ws.send(jpeg)
            else:
                self.ws.send(json.dumps({"op": "frame",
                                         "image_b64": base64.b64encode(jpeg).decode()}))
            reply = json.loads(self.ws.recv(timeout=FRAME_TIMEOUT_S))
        except (OSError, WebSocketException, TimeoutError, ValueError) as exc:
            return FrameError(None, f"connection lost: {exc}", fatal=True)
        if reply.get("op") == "error":
            return FrameError(reply.get("code"), str(reply.get("message")),
                              bool(reply.get("fatal", True)))
        self.frames_answered += 1
        return reply

    def close(self) -> int | None:
        """Send delete and wait for `closed`: its `frames`, else the local count. A connection
        the server already closed (e.g. a Ctrl+C that cut a message in half) is done: the
        server released the session with it."""
        if self.ws is None:
            return None
        try:
            self.ws.send(json.dumps({"op": "delete"}))
            deadline = time.monotonic() + CLOSE_TIMEOUT_S
            while True:  # a reply to a frame in flight at Ctrl+C may come first
                reply = json.loads(self.ws.recv(timeout=max(0.0, deadline - time.monotonic())))
                if reply.get("op") == "closed":
                    frames = reply.get("frames")
                    return frames if isinstance(frames, int) else self.frames_answered
        except ConnectionClosed:
            return self.frames_answered
        except (OSError, WebSocketException, TimeoutError, ValueError) as exc:
            raise CleanupError(f"no 'closed' reply: {exc}") from exc
        finally:
            self.ws.close()  # dropping the connection also releases the session server-side


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and "message" in error:
        return str(error["message"])
    return str(error if error is not None else body)


class RestTransport:
    """Sessions over REST: create, POST one frame at a time, DELETE (spec §4, §5, §7)."""

    def __init__(self, base_url: str, frame_format: str, api_key: str | None = None) -> None:
        self.client = httpx.Client(base_url=base_url, timeout=PREFLIGHT_TIMEOUT_S,
                                   headers=bearer_headers(api_key))
        self.frame_format = frame_format
        self.session_id: str | None = None

    def open(self, body: dict) -> dict:
        try:
            response = self.client.post(SESSIONS_PATH, json=body)
        except httpx.HTTPError as exc:
            raise StreamError(f"session create failed: {exc}") from exc
        if not response.is_success:
            raise StreamError(f"HTTP {response.status_code}: {response.text}")
        reply = response.json()
        self.session_id = reply["session_id"]
        return reply

    def send(self, jpeg: bytes) -> dict | FrameError:
        path = f"{SESSIONS_PATH}/{self.session_id}/frame"
        try:
            if self.frame_format == "binary":
                response = self.client.post(path, content=jpeg, timeout=FRAME_TIMEOUT_S,
                                            headers={"Content-Type": "image/jpeg"})
            else:
                response = self.client.post(path, timeout=FRAME_TIMEOUT_S,
                                            json={"image_b64": base64.b64encode(jpeg).decode()})
        except httpx.HTTPError as exc:
            return FrameError(None, f"frame request failed: {exc}", fatal=True)
        if response.is_success:
            return response.json()
        message = _error_message(response)
        if response.status_code == 415 and self.frame_format == "binary":
            message += ("; this server refuses raw image bodies over REST: "
                        "use --frame-format base64")
        return FrameError(response.status_code, message, fatal=True)  # frames are never retried

    def close(self) -> int | None:
        try:
            if self.session_id is None:
                return None
            try:
                response = self.client.delete(f"{SESSIONS_PATH}/{self.session_id}")
            except httpx.HTTPError as exc:
                raise CleanupError(str(exc)) from exc
            if response.status_code == 404:
                return None  # already gone
            if not response.is_success:
                raise CleanupError(f"HTTP {response.status_code}: {_error_message(response)}")
            return response.json().get("frames")
        finally:
            self.client.close()


def make_transport(opts: StreamOptions) -> Transport:
    if opts.transport == "rest":
        return RestTransport(opts.url, opts.frame_format, opts.api_key)
    return WebSocketTransport(opts.url, opts.frame_format, opts.api_key)
