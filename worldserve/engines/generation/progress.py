"""What the generation engine tells a request about where it is (`GenerationProgress`).

A request hears `queued` with its position in the waiting queue whenever that position changes,
`encode` at progress 0 when the engine admits it into a batch (the api's job turns
`in_progress` then, not when the request was accepted), then `denoise` after every step,
`decode` and `mux`; `progress` only rises. Internal (warmup) requests hear nothing.
"""

from __future__ import annotations

from typing import Iterable

from worldserve.engines.generation.batch import ScheduledRequest
from worldserve.ipc.messages import GenerationProgress

QUEUE_POSITION = "queue_position"  # ScheduledRequest.extra: the position the request last heard


def report(requests: Iterable[ScheduledRequest], progress: int, phase: str, done: int = 0,
           total: int = 0) -> None:
    """`progress` in `phase` to each request that has not heard as much yet."""
    for request in requests:
        if request.payload.msg is None or progress <= request.last_progress:
            continue
        request.last_progress = progress
        request.payload.reply(GenerationProgress(
            request_id=request.request_id, progress=progress, steps_done=done,
            steps_total=total, phase=phase))


def report_admitted(admitted: Iterable[ScheduledRequest],
                    waiting: Iterable[ScheduledRequest]) -> None:
    """`admitted` left the queue into a batch; the requests still `waiting` moved up."""
    for request in admitted:
        request.extra.pop(QUEUE_POSITION, None)
        _send(request, 0, "encode")
    report_queue(waiting)


def report_queue(waiting: Iterable[ScheduledRequest]) -> None:
    """`queued` with its new position to each waiting request whose position changed."""
    for position, request in enumerate(waiting):
        if request.extra.get(QUEUE_POSITION) != position:
            request.extra[QUEUE_POSITION] = position
            _send(request, 0, "queued", queue_position=position)


def _send(request: ScheduledRequest, progress: int, phase: str,
          queue_position: int | None = None) -> None:
    if request.payload.msg is not None:
        request.payload.reply(GenerationProgress(
            request_id=request.request_id, progress=progress, steps_done=0,
            steps_total=request.params.num_inference_steps, phase=phase,
            queue_position=queue_position))
