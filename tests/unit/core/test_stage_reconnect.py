"""A request sent to a stage that just died stays queued in the api's DEALER socket and reaches
the stage restarted on the same address (what the soak found: sessions created on a restarted
reasoner that nothing released). `ZmqStageClient.reconnect()`, which the supervisor calls before
a restart, drops it. Real ZeroMQ sockets on an ipc address; the stage is a bare StageServer."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from worldserve.ipc.client import ZmqStageClient
from worldserve.ipc.messages import Cancel, Message
from worldserve.ipc.transport import StageServer


def received_by_a_new_server(address: str, wait_s: float = 1.0) -> list[Message | None]:
    server = StageServer(address)
    try:
        got: list[Message | None] = []
        for _ in range(int(wait_s / 0.05)):
            got += [msg for _, msg in server.receive(50)]
        return got
    finally:
        server.close()


async def sent_while_dead(tmp_path: Path, reconnect: bool) -> list[Message | None]:
    address = f"ipc://{tmp_path / 'stage.sock'}"
    first = StageServer(address)
    client = ZmqStageClient("reasoner", address)
    client.send_nowait(Cancel(request_id="before", target_id="x"))
    assert [m.request_id for _, m in first.receive(2000) if m] == ["before"]
    first.close()  # the stage process dies
    await asyncio.sleep(0.2)  # the client's connection notices
    client.send_nowait(Cancel(request_id="stale", target_id="x"))  # before the watcher did
    await asyncio.sleep(0.2)
    client.mark_down("killed by signal SIGKILL")
    if reconnect:
        client.reconnect()
    try:
        return await asyncio.to_thread(received_by_a_new_server, address)
    finally:
        await client.close()


@pytest.mark.parametrize("reconnect", [False, True])
async def test_a_restarted_stage_gets_no_request_sent_to_the_dead_one(
        tmp_path: Path, reconnect: bool) -> None:
    stale = [m.request_id for m in await sent_while_dead(tmp_path, reconnect) if m]
    assert stale == ([] if reconnect else ["stale"])  # without reconnect(): delivered late
