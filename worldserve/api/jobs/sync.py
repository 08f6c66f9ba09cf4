"""The synchronous forms of a video job (`POST /v1/videos/sync`, the Generator NIM's
`POST /v1/infer`): the very job `POST /v1/videos` creates (listed, retrievable, counted), awaited
to its end. A client that disconnects while it waits cancels it (`until_disconnect`), unless it
sent an Idempotency-Key."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Awaitable, TypeVar

from starlette.requests import Request

from worldserve.api.jobs.idempotency import IdempotencyKey
from worldserve.api.jobs.params import MediaRequest
from worldserve.api.jobs.records import JobRecord, JobStatus
from worldserve.api.jobs.service import MediaService
from worldserve.errors import from_code

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client went away before the answer was ready (its work was cancelled)."""


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result, or ClientDisconnected once the client has gone (the work is cancelled
    then). The body must have been read: this consumes the request's remaining messages."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    raise ClientDisconnected()


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def run_video(service: MediaService, request: MediaRequest,
                    key: IdempotencyKey | None = None) -> JobRecord:
    """Create the video job (or find the one `key` made) and wait for its end; its completed
    record (a failed job raises its error, a job cancelled here is cancelled on the stage)."""
    record = await service.create_video(request, key)
    relay = service.tasks.get(record.id)
    try:
        if relay is not None:
            await asyncio.shield(relay)
    except asyncio.CancelledError:
        # With an Idempotency-Key the job outlives the connection: the client's retry under
        # the key (or another waiter on it) gets its answer.
        if key is None:
            service.cancel_video(record, "the client disconnected")
        raise
    done = service.get_video(record.id)
    if done.status != JobStatus.COMPLETED:
        error = done.error
        raise from_code(error.code if error else "internal_error",
                        error.message if error else f"the job ended {done.status.value}")
    return done
