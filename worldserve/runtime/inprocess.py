"""`InProcessStageClient`: a `StageClient` whose stage is an engine object in this process.

Same interface and reply semantics as the ZeroMQ client (it is one, minus the socket): the
requests go through the stage's own `StageLoop` dispatch (Hello, stats, echo, cancel, submit),
and every message crosses the same msgpack codec in both directions, so what an engine or the
api sees is exactly what the wire would carry. The engine is stepped by an asyncio task on the
caller's loop, one `step()` per turn. For tests that are not about the wire (vLLM's
`InprocClient`): the api against a fake engine, without sockets or threads.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import uuid
from typing import Callable

from worldserve.ipc.client import ReplyStream, StageClient, StatusListener
from worldserve.ipc.codec import MessageCodec
from worldserve.ipc.messages import Message, Reply, Request
from worldserve.runtime.engine import Engine
from worldserve.runtime.stage import StageLoop

PEER = b"inprocess"


class _Mailbox:
    """What `StageLoop` takes for its socket: an inbox, and delivery back to the client."""

    def __init__(self, deliver: Callable[[Message], None]) -> None:
        self.inbox: collections.deque[Message] = collections.deque()
        self._deliver = deliver
        self._codec = MessageCodec()

    def receive(self, timeout_ms: float) -> list[tuple[bytes, Message | None]]:
        items = [(PEER, msg) for msg in self.inbox]
        self.inbox.clear()
        return items

    def send(self, peer: bytes, msg: Message) -> None:
        self._deliver(self._codec.decode(self._codec.encode(msg)))

    def close(self) -> None:
        self.inbox.clear()


class InProcessStageClient(StageClient):
    """A stage client for `engine`, already handshaken (the engine is loaded)."""

    def __init__(self, stage: str, engine: Engine, *, client_id: str | None = None) -> None:
        # Deliberately not StageClient.__init__: no ZeroMQ context or socket.
        self.stage = stage
        self.address = f"inprocess://{stage}"
        self.client_id = client_id or uuid.uuid4().hex
        self.engine = engine
        self.down_reason: str | None = None
        self._codec = MessageCodec()
        self._futures: dict[str, asyncio.Future[Reply]] = {}
        self._streams: dict[str, ReplyStream] = {}
        self._listeners: list[StatusListener] = []
        self._recv_task: asyncio.Task[None] | None = None
        self._mailbox = _Mailbox(self._route)
        self._stage_loop = StageLoop(stage, self._mailbox, engine)  # type: ignore[arg-type]
        self._wake = asyncio.Event()
        self.info = self._stage_loop.info("inprocess")
        self.state = self.info.state

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._recv_task is None:
            self._recv_task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        task, self._recv_task = self._recv_task, None
        if task is not None:
            if task.done() and not task.cancelled():
                task.exception()  # an engine failure, already reported through mark_down
            task.cancel()
            # A test client's app may have run on a loop that is gone; only await our own.
            if not task.done() and task.get_loop() is asyncio.get_running_loop():
                with contextlib.suppress(asyncio.CancelledError):  # the cancel just sent
                    await task
        self._mailbox.close()

    # ------------------------------------------------------------------ transport

    def send_nowait(self, request: Request) -> None:
        if self.down_reason is None:
            self._mailbox.inbox.append(self._codec.decode(self._codec.encode(request)))
            self._wake.set()

    async def _send(self, request: Request) -> None:
        self.start()
        self.send_nowait(request)

    async def _run(self) -> None:
        try:
            await self._beat()
        except Exception as exc:  # what a stage process's death is: every waiter fails now
            self.mark_down(f"the engine failed: {type(exc).__name__}: {exc}")
            raise

    async def _beat(self) -> None:
        """The stage loop's beat: dispatch what arrived, one engine step, report state."""
        loop = self._stage_loop
        while True:
            self._wake.clear()
            for peer, msg in self._mailbox.receive(0):
                loop._dispatch(peer, msg)
            loop._send_due_echoes()
            busy = self.engine.has_work()
            if busy:
                loop.step_engine()
            loop._broadcast_state_change()
            if busy:
                await asyncio.sleep(0)  # let the api side run between engine steps
            else:
                await self._idle(loop)

    async def _idle(self, loop: StageLoop) -> None:
        wait_s = loop._echo_wait_ms(1000.0) / 1000 if loop._echoes else None
        try:
            async with asyncio.timeout(wait_s):
                await self._wake.wait()
        except TimeoutError:
            pass  # an echo fell due: the next turn sends it
