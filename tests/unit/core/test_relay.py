"""StageClient <-> StageLoop over real ZeroMQ (ipc), with a small in-test engine in a thread;
the same tests against InProcessStageClient prove it keeps the client's semantics."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, AsyncIterator, Iterator

import pytest

from worldserve.errors import InvalidRequest, RequestTimeout, StageUnavailable
from worldserve.ipc.capabilities import GenerationCapabilities
from worldserve.ipc.client import StageClient, ZmqStageClient, new_request_id
from worldserve.ipc.messages import (
    ChatCompletion,
    ChatDelta,
    ChatResult,
    CloseSession,
    Echo,
    EchoReply,
    ReasonerSampling,
    Request,
    SessionClosed,
    StageStats,
    StatsRequest,
)
from worldserve.ipc.transport import StageServer, check_address
from worldserve.runtime.inprocess import InProcessStageClient
from worldserve.runtime.stage import StageLoop


class CountingEngine:
    """Streams `n` deltas per ChatCompletion (one per step), answers CloseSession at once,
    and fails any other request."""

    model_name, model_path, num_params = "counting", "/nowhere", 0

    def __init__(self, num_deltas: int = 5) -> None:
        self.num_deltas = num_deltas
        self.step_delay_s = 0.0
        self.active: list[tuple[str, int, Any]] = []
        self.cancelled: list[str] = []

    def capabilities(self) -> GenerationCapabilities:
        return GenerationCapabilities(max_batch_size=self.num_deltas)

    def state(self) -> str:
        return "ready"

    def submit(self, request: Request, reply: Any) -> None:
        if isinstance(request, ChatCompletion):
            self.active.append((request.request_id, 0, reply))
        elif isinstance(request, CloseSession):
            reply(SessionClosed(request_id=request.request_id, session_id=request.session_id,
                                frames=0))
        else:
            raise InvalidRequest(f"cannot handle {type(request).__name__}")

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)
        self.active = [a for a in self.active if a[0] != request_id]

    def has_work(self) -> bool:
        return bool(self.active)

    def step(self) -> None:
        time.sleep(self.step_delay_s)
        request_id, sent, reply = self.active.pop(0)
        if sent < self.num_deltas:
            reply(ChatDelta(request_id=request_id, text=str(sent)))
            self.active.append((request_id, sent + 1, reply))
        else:
            reply(ChatResult(request_id=request_id, text="done", finish_reason="stop",
                             prompt_tokens=1, completion_tokens=sent))

    def stats(self) -> dict[str, Any]:
        return {"queue_depth": len(self.active), "running": len(self.active)}

    def shutdown(self) -> None:
        pass


@pytest.fixture(params=["zeromq", "inprocess"])
def stage(request: pytest.FixtureRequest,
          tmp_path: Path) -> Iterator[tuple[str | None, StageLoop | SimpleNamespace]]:
    """The stage behind the client: a StageLoop thread over ZeroMQ, or (address None) the
    engine alone for an InProcessStageClient. Every test here runs against both clients."""
    if request.param == "inprocess":
        yield None, SimpleNamespace(engine=CountingEngine())
        return
    address = f"ipc://{tmp_path / 'stage.sock'}"
    loop = StageLoop("test", StageServer(address), CountingEngine())
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    yield address, loop
    loop.running = False
    thread.join(5)
    loop.server.close()


@pytest.fixture
async def client(stage: tuple[str | None, Any]) -> AsyncIterator[StageClient]:
    """A handshaken client, always closed (an open ZeroMQ socket would block interpreter exit)."""
    address, loop = stage
    client = (ZmqStageClient("test", address) if address
              else InProcessStageClient("test", loop.engine))
    try:
        await client.handshake(timeout_s=5)
        yield client
    finally:
        await client.close()


def chat(request_id: str | None = None) -> ChatCompletion:
    return ChatCompletion(request_id=request_id or new_request_id(), messages=[],
                          sampling=ReasonerSampling())


async def test_handshake_call_and_stats(client: StageClient) -> None:
    info = client.info
    assert info is not None
    assert info.stage == "test" and info.capabilities == GenerationCapabilities(max_batch_size=5)
    assert client.state == "ready"
    reply = await client.call(Echo(request_id="e1", payload=b"x" * 1024), timeout_s=5)
    assert isinstance(reply, EchoReply) and reply.payload == b"x" * 1024
    stats = await client.call(StatsRequest(request_id="s1"), timeout_s=5)
    assert isinstance(stats, StageStats) and stats.queue_depth == 0


async def test_stream_yields_every_reply_in_order(client: StageClient) -> None:
    stream = await client.stream(chat())
    texts = [reply.text async for reply in stream]
    assert texts == ["0", "1", "2", "3", "4", "done"]


async def test_concurrent_streams_are_routed_by_request_id(client: StageClient) -> None:

    async def run(request_id: str) -> list[str]:
        return [r.text async for r in await client.stream(chat(request_id))]

    results = await asyncio.gather(*(run(f"r{i}") for i in range(4)))
    assert all(r == ["0", "1", "2", "3", "4", "done"] for r in results)


async def test_engine_error_becomes_the_mapped_exception(client: StageClient) -> None:
    with pytest.raises(InvalidRequest, match="cannot handle StatsRequest|cannot handle"):
        from worldserve.ipc.messages import SessionFrame

        await client.call(SessionFrame(request_id="f", session_id="s", image=b"", received_at=0),
                          timeout_s=5)


async def test_timeout_cancels_in_the_stage(client: StageClient) -> None:
    with pytest.raises(RequestTimeout):
        await client.call(Echo(request_id="slow", delay_ms=2000), timeout_s=0.05)


async def test_stream_cancel_reaches_the_engine(stage: tuple[str | None, Any],
                                                client: StageClient) -> None:
    loop = stage[1]
    loop.engine.num_deltas, loop.engine.step_delay_s = 10**9, 0.001
    stream = await client.stream(chat("long"))
    async for _ in stream:
        break
    stream.cancel()
    for _ in range(100):
        if "long" in loop.engine.cancelled:
            break
        await asyncio.sleep(0.02)
    assert "long" in loop.engine.cancelled


async def test_mark_down_fails_waiters_and_new_requests(stage: tuple[str | None, Any],
                                                        client: StageClient) -> None:
    # the stream must still be open when the stage "dies"
    stage[1].engine.num_deltas, stage[1].engine.step_delay_s = 10**9, 0.001
    waiter = asyncio.ensure_future(client.call(Echo(request_id="w", delay_ms=5000), timeout_s=10))
    stream = await client.stream(chat())
    await asyncio.sleep(0.05)
    client.mark_down("killed by signal SIGKILL")
    with pytest.raises(StageUnavailable, match="SIGKILL"):
        await waiter
    with pytest.raises(StageUnavailable):
        async for _ in stream:
            pass
    with pytest.raises(StageUnavailable):
        await client.call(Echo(request_id="after"), timeout_s=1)
    assert client.state == "failed"


@pytest.mark.parametrize("address", ["tcp://0.0.0.0:5555", "tcp://10.0.0.1:1", "inproc://x"])
def test_only_ipc_and_loopback_addresses(address: str) -> None:
    with pytest.raises(ValueError):
        check_address(address)


def test_loopback_tcp_is_accepted() -> None:
    assert check_address("tcp://127.0.0.1:5555") == "tcp://127.0.0.1:5555"


async def test_inprocess_engine_crash_fails_waiters_like_a_dead_stage() -> None:
    engine = CountingEngine()
    client = InProcessStageClient("test", engine)
    engine.step = lambda: (_ for _ in ()).throw(RuntimeError("boom"))  # type: ignore[method-assign]
    try:
        with pytest.raises(StageUnavailable, match="the engine failed: RuntimeError: boom"):
            async for _ in await client.stream(chat()):
                pass
        assert client.state == "failed"
    finally:
        await client.close()


async def test_every_transport_is_the_one_interface() -> None:
    """The api types against `StageClient`; each transport implements it through its
    `__init__` (no subclass skips it), and the interface alone cannot be built."""
    with pytest.raises(TypeError, match="abstract"):
        StageClient("test", "nowhere")  # type: ignore[abstract]
    client = InProcessStageClient("test", CountingEngine())
    try:
        assert isinstance(client, StageClient) and client.client_id and client.info is not None
        seen: list[str] = []
        client.add_status_listener(lambda stage, state: seen.append(state))
        client.mark_down("gone")  # the base class's liveness, shared by every transport
        assert seen == ["failed"] and client.down_reason == "gone"
    finally:
        await client.close()
