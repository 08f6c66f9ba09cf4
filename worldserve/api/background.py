"""Background work for as long as a context is open: the app's lifespan runs its periodic tasks
(free heap pages handed back, the opt-in allocation tracing) through `running`."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator, Coroutine


@contextlib.asynccontextmanager
async def running(work: Coroutine[Any, Any, None], name: str) -> AsyncIterator[None]:
    """`work` as a task named `name` while the context is open; cancelled and awaited on exit."""
    task = asyncio.create_task(work, name=name)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
