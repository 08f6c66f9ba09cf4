"""`InProcessStageClient`: the `StageClient` transport whose stage is an engine in this process.

Same interface and reply semantics as the ZeroMQ client (both are `MessageStageClient`s): the
requests go through the stage's own `StageLoop` (Hello, stats, echo, cancel, submit), and every
message crosses the same msgpack codec in both directions, so what an engine or the api sees is
exactly what the wire would carry. The engine is stepped by an asyncio task on the caller's
loop, one `StageLoop.beat()` per turn, the very turn a stage process runs. For tests that are
not about the wire, and for each Ray replica (vLLM's `InprocClient`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import Callable

from worldserve.ipc.client import MessageStageClient
from worldserve.ipc.codec import MessageCodec
from worldserve.ipc.messages import Message, Request, StageInfo
from worldserve.runtime.engine import Engine
from worldserve.runtime.stage import StageLoop

PEER = b"inprocess"


class _Mailbox:
    """The stage loop's socket (a `StageSocket`): an inbox, and delivery back to the client."""

    def __init__(self, deliver: Callable[[Message], None]) -> None:
        self.inbox: collections.deque[Message] = collections.deque()
        self._deliver = deliver
        self._codec = MessageCodec()

    def receive(self, timeout_ms: float) -> list[tuple[bytes, Message | None]]:
        items: list[tuple[bytes, Message | None]] = [(PEER, msg) for msg in self.inbox]
        self.inbox.clear()
        return items

    def send(self, peer: bytes, msg: Message) -> None:
        self._deliver(self._codec.decode(self._codec.encode(msg)))

    def close(self) -> None:
        self.inbox.clear()


class InProcessStageClient(MessageStageClient):
    """A stage client for `engine`, already handshaken (the engine is loaded)."""

    def __init__(self, stage: str, engine: Engine, *, client_id: str | None = None) -> None:
        super().__init__(stage, f"inprocess://{stage}", client_id=client_id)
        self.engine = engine
        self._task: asyncio.Task[None] | None = None
        self._mailbox = _Mailbox(self._route)
        self._stage_loop = StageLoop(stage, self._mailbox, engine)
        self._wake = asyncio.Event()
        self.refresh_info("inprocess")

    def refresh_info(self, request_id: str) -> StageInfo:
        """The stage's `StageInfo` as a Hello would answer it now (also kept as `info`)."""
        self.info = self._stage_loop.info(request_id)
        self.state = self.info.state
        return self.info

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        task, self._task = self._task, None
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
        """The stage loop's beats: at once while the engine is busy (yielding to the api side
        between two), else when a request arrives or an echo falls due."""
        while True:
            self._wake.clear()
            if self._stage_loop.beat(0):
                await asyncio.sleep(0)
            else:
                await self._idle()

    async def _idle(self) -> None:
        due_ms = self._stage_loop.next_due_ms()
        try:
            async with asyncio.timeout(None if due_ms is None else due_ms / 1000):
                await self._wake.wait()
        except TimeoutError:
            pass  # an echo fell due: the next beat sends it
