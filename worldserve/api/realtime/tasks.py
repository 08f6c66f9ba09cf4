"""Ending a realtime session's concurrent tasks (generate, listen, watchdog), shared by both
realtime protocols."""

from __future__ import annotations

import asyncio
from typing import Any

STOP_RETRY_S = 0.5


async def stop_all(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel until every task has ended: a cancellation can be lost when it races with a
    completing await, so a task still running after a short wait is cancelled again. Every
    task's exception is then marked retrieved (a loser's ClientGone is expected, and the
    caller re-raises the winner's through its result()): without that, a session whose own
    wait was cancelled logged "Task exception was never retrieved" for its ended listener.
    It is marked when each task ends, so a task that ends after stop_all itself was cancelled
    (a server shutting down mid-stop) is marked too."""
    for task in tasks:
        task.add_done_callback(_mark_retrieved)
    while pending := [t for t in tasks if not t.done()]:
        for task in pending:
            task.cancel()
        await asyncio.wait(pending, timeout=STOP_RETRY_S)


def _mark_retrieved(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()
