"""stop_all ends a realtime session's tasks and leaves no exception unretrieved."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from worldserve.api.realtime.sender import ClientGone
from worldserve.api.realtime.tasks import stop_all


async def _gone() -> None:
    raise ClientGone()


def test_an_ended_task_s_exception_is_retrieved_even_when_the_session_wait_is_cancelled() -> None:
    unretrieved: list[dict[str, Any]] = []

    async def session() -> None:
        tasks = [asyncio.create_task(_gone()), asyncio.create_task(asyncio.sleep(60))]
        try:
            await asyncio.sleep(60)  # the session's own wait, cancelled from outside
        finally:
            await stop_all(tasks)
            assert all(t.done() for t in tasks)

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(
            lambda loop, context: unretrieved.append(context))
        running = asyncio.create_task(session())
        await asyncio.sleep(0.05)  # the listener has ended with ClientGone by now
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        gc.collect()  # an unretrieved exception is reported when its task is collected
        await asyncio.sleep(0)

    asyncio.run(main())
    assert [c.get("message") for c in unretrieved] == []


async def _gone_later() -> None:
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        await asyncio.sleep(0.05)  # ends after its stopper was itself cancelled
        raise ClientGone() from None


def test_a_task_that_ends_after_stop_all_was_cancelled_leaves_no_exception_unretrieved() -> None:
    unretrieved: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(
            lambda loop, context: unretrieved.append(context))
        task = asyncio.create_task(_gone_later())
        await asyncio.sleep(0)
        stopper = asyncio.create_task(stop_all([task]))
        await asyncio.sleep(0.01)  # stop_all waits for the task to end...
        stopper.cancel()  # ...and is cancelled first (a shutdown)
        await asyncio.gather(stopper, return_exceptions=True)
        await asyncio.sleep(0.1)  # the task ends with ClientGone
        assert task.done() and not task.cancelled()
        del task
        gc.collect()
        await asyncio.sleep(0)

    asyncio.run(main())
    assert [c.get("message") for c in unretrieved] == []
