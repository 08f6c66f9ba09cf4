"""Api side of one stage: requests, streams of replies, and the stage's liveness.

`StageClient` is the one interface the api uses (vLLM's `EngineCoreClient`), with one
implementation per transport:

- `ZmqStageClient` (here): one DEALER socket per stage process, driven by asyncio;
- `InProcessStageClient` (`runtime/inprocess.py`): the engine in this process, stepped by the
  stage loop's own `beat()` on the caller's event loop (tests, and each Ray replica);
- `RayStageClient` (`cluster/client.py`): the replicas of a Ray Serve deployment.

The first two carry messages both ways (`MessageStageClient`): every reply is routed to the
future or stream waiting for its `request_id`. When a stage goes down, every waiter fails at
once with `StageUnavailable` and new requests fail immediately.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import logging
import uuid
from typing import AsyncIterator, Callable

import zmq
import zmq.asyncio

from worldserve.errors import RequestTimeout, StageUnavailable, WorldserveError, from_code
from worldserve.ipc.codec import MessageCodec
from worldserve.ipc.messages import (
    Cancel,
    ErrorReply,
    Hello,
    Message,
    Reply,
    Request,
    StageInfo,
    StageState,
    StageStatus,
)
from worldserve.ipc.transport import SOCKET_HWM, check_address

log = logging.getLogger("worldserve.ipc")

StatusListener = Callable[[str, StageState], None]


def new_request_id(prefix: str = "req") -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class ReplyStream:
    """Replies to one streaming request, in order, ending with a terminal reply.

    Bounded: at most `max_queued` replies wait. Overflow policy: the oldest waiting
    non-terminal reply is dropped (progress and previews are superseded by newer ones); a
    terminal reply is never dropped. `num_dropped` counts drops.
    """

    def __init__(self, client: StageClient, request_id: str, max_queued: int) -> None:
        self._client = client
        self.request_id = request_id
        self._items: collections.deque[Reply | WorldserveError] = collections.deque()
        self._max_queued = max_queued
        self._ready = asyncio.Event()
        self._done = False
        self.num_dropped = 0

    def push(self, item: Reply | WorldserveError) -> None:
        """Queue one reply (or the error that ends the stream); the transport calls this."""
        terminal = isinstance(item, WorldserveError) or item.terminal
        if not terminal and len(self._items) >= self._max_queued:
            for i, queued in enumerate(self._items):
                if isinstance(queued, Reply) and not queued.terminal:
                    del self._items[i]
                    self.num_dropped += 1
                    break
        self._items.append(item)
        self._ready.set()

    def __aiter__(self) -> AsyncIterator[Reply]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Reply]:
        while not self._done:
            while not self._items:
                self._ready.clear()
                await self._ready.wait()
            item = self._items.popleft()
            if isinstance(item, WorldserveError):
                self._finish()
                raise item
            if item.terminal:
                self._finish()
            yield item

    def cancel(self) -> None:
        """Stop waiting and ask the stage to cancel the request (idempotent)."""
        if not self._done:
            self._client.send_nowait(
                Cancel(request_id=new_request_id("cancel"), target_id=self.request_id)
            )
            self._finish()

    def _finish(self) -> None:
        self._done = True
        self._client.stream_finished(self.request_id)


class StageClient(abc.ABC):
    """The api's connection to one stage, whatever the transport."""

    def __init__(self, stage: str, address: str, *, client_id: str | None = None) -> None:
        self.stage = stage
        self.address = address
        self.client_id = client_id or uuid.uuid4().hex
        self.state: StageState = "starting"
        self.info: StageInfo | None = None
        self.down_reason: str | None = None
        self._streams: dict[str, ReplyStream] = {}
        self._listeners: list[StatusListener] = []

    # ------------------------------------------------------------------ transport (abstract)

    @abc.abstractmethod
    def start(self) -> None:
        """Begin receiving (idempotent); called from the event loop the client serves."""

    @abc.abstractmethod
    async def handshake(self, timeout_s: float) -> StageInfo:
        """Wait until the stage has loaded its models and said who it is (`info`)."""

    @abc.abstractmethod
    async def call(self, request: Request, *, timeout_s: float | None = None) -> Reply:
        """Send `request` and return its single reply (an `ErrorReply` is raised)."""

    @abc.abstractmethod
    async def stream(self, request: Request, *, max_queued: int = 64) -> ReplyStream:
        """Send a streaming request; iterate the returned stream for its replies."""

    @abc.abstractmethod
    def send_nowait(self, request: Request) -> None:
        """Fire-and-forget (cancellations, releases). Dropped silently when the stage is down."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    # ------------------------------------------------------------------ liveness

    def add_status_listener(self, listener: StatusListener) -> None:
        self._listeners.append(listener)

    def mark_down(self, reason: str) -> None:
        """The stage is gone: fail every waiter now and refuse new requests."""
        self.down_reason = reason
        self._set_state("failed")
        self._fail_waiters(StageUnavailable(f"stage '{self.stage}' is unavailable: {reason}",
                                            stage=self.stage))

    def _fail_waiters(self, error: WorldserveError) -> None:
        for stream in list(self._streams.values()):
            stream.push(error)
        self._streams.clear()

    def stream_finished(self, request_id: str) -> None:
        """A stream ended or was cancelled (its `ReplyStream` says so): forget it."""
        self._streams.pop(request_id, None)

    def _check_up(self) -> None:
        if self.down_reason is not None:
            raise StageUnavailable(
                f"stage '{self.stage}' is unavailable: {self.down_reason}", stage=self.stage
            )

    def _set_state(self, state: StageState) -> None:
        if state == self.state:
            return
        self.state = state
        for listener in self._listeners:
            listener(self.stage, state)


class MessageStageClient(StageClient):
    """A transport that carries messages both ways: requests go out through `_send`, every
    message from the stage comes back through `_route` (replies by `request_id`, status
    broadcasts to the listeners)."""

    def __init__(self, stage: str, address: str, *, client_id: str | None = None) -> None:
        super().__init__(stage, address, client_id=client_id)
        self._codec = MessageCodec()
        self._futures: dict[str, asyncio.Future[Reply]] = {}

    @abc.abstractmethod
    async def _send(self, request: Request) -> None: ...

    async def handshake(self, timeout_s: float) -> StageInfo:
        self.start()
        reply = await self.call(
            Hello(request_id=new_request_id("hello"), client_id=self.client_id), timeout_s=timeout_s
        )
        assert isinstance(reply, StageInfo)  # the stage protocol guarantees it; not client input
        self.info = reply
        self.state = reply.state
        return reply

    def _fail_waiters(self, error: WorldserveError) -> None:
        for fut in self._futures.values():
            if not fut.done():
                fut.set_exception(error)
        self._futures.clear()
        super()._fail_waiters(error)

    async def call(self, request: Request, *, timeout_s: float | None = None) -> Reply:
        self._check_up()
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._futures[request.request_id] = fut
        await self._send(request)
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation
            # that races with the reply, and the caller's loop would then never stop.
            async with asyncio.timeout(timeout_s):
                return await fut
        except TimeoutError:
            self.send_nowait(
                Cancel(request_id=new_request_id("cancel"), target_id=request.request_id)
            )
            raise RequestTimeout(
                f"stage '{self.stage}' did not answer within {timeout_s:g} s"
            ) from None
        finally:
            self._futures.pop(request.request_id, None)

    async def stream(self, request: Request, *, max_queued: int = 64) -> ReplyStream:
        self._check_up()
        stream = ReplyStream(self, request.request_id, max_queued)
        self._streams[request.request_id] = stream
        await self._send(request)
        return stream

    def _route(self, msg: Message) -> None:
        if isinstance(msg, StageStatus):
            self._set_state(msg.state)
            return
        if not isinstance(msg, Reply):
            log.warning("stage %s sent unexpected %s", self.stage, type(msg).__name__)
            return
        item: Reply | WorldserveError = msg
        if isinstance(msg, ErrorReply):
            item = from_code(msg.code, msg.message)
        fut = self._futures.get(msg.request_id)
        if fut is not None and not fut.done():
            if isinstance(item, WorldserveError):
                fut.set_exception(item)
            else:
                fut.set_result(item)
            return
        stream = self._streams.get(msg.request_id)
        if stream is not None:
            stream.push(item)


class ZmqStageClient(MessageStageClient):
    """The stage is another process: one DEALER socket, a receive task on the event loop."""

    def __init__(self, stage: str, address: str, *, client_id: str | None = None) -> None:
        super().__init__(stage, check_address(address), client_id=client_id)
        self._ctx = zmq.asyncio.Context()
        self._sock = self._connect()
        self._recv_task: asyncio.Task[None] | None = None

    def _connect(self) -> zmq.asyncio.Socket:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, SOCKET_HWM)
        sock.setsockopt(zmq.RCVHWM, SOCKET_HWM)
        sock.connect(self.address)
        return sock

    def start(self) -> None:
        if self._recv_task is None:
            self._recv_task = asyncio.get_running_loop().create_task(self._receive_loop())

    def reconnect(self) -> None:
        """A new connection, for a stage that died and will be restarted on the same address.
        The old one is dropped with what it still queued: a DEALER keeps unsent requests across
        a reconnect, and a restarted stage must not run requests whose callers already got 503
        (a session created there would hold a slot that nothing ever releases)."""
        if self._recv_task is not None:
            self._recv_task.cancel()
            self._recv_task = None
        self._sock.close(0)
        self._sock = self._connect()

    def revive(self, info: StageInfo) -> None:
        """The supervisor restarted the stage and it answered the handshake: serve again."""
        self.down_reason = None
        self.info = info
        self._set_state(info.state)
        self.start()

    async def close(self) -> None:
        if self._recv_task is not None:
            self._recv_task.cancel()
            try:
                await self._recv_task
            except (asyncio.CancelledError, Exception):
                pass
        self._sock.close(0)
        self._ctx.term()

    def send_nowait(self, request: Request) -> None:
        if self.down_reason is None:
            # Sent now, not from a task: a later call() must never overtake it.
            self._sock.send(self._codec.encode(request))

    async def _send(self, request: Request) -> None:
        await self._sock.send(self._codec.encode(request))

    async def _receive_loop(self) -> None:
        while True:
            data = await self._sock.recv()
            try:
                msg = self._codec.decode(data)
            except Exception:
                log.error("stage %s sent an undecodable message", self.stage)
                continue
            self._route(msg)
            # recv() on a busy socket completes without suspending; yield so a fast stage
            # cannot starve the routes' own tasks.
            await asyncio.sleep(0)
