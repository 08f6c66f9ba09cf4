"""The stage side of a realtime session, shared by both realtime protocols: open the session,
then turn one chunk's sampled controls into a `RealtimeChunk` and its reply into frames.

Whichever protocol spoke, the stage sees the same messages (`RealtimeOpen` once, then
`RealtimeChunk` per chunk); this module is the only place that builds them from a session.
"""

from __future__ import annotations

import time
import uuid

import numpy as np

from worldserve.api.realtime.controls import ChunkControls
from worldserve.api.realtime.sender import GeneratedChunk
from worldserve.api.realtime.service import RealtimeConnectionSettings, RealtimeService
from worldserve.errors import InternalError
from worldserve.ipc.messages import RealtimeChunk, RealtimeChunkResult, RealtimeOpened


async def open_session(service: RealtimeService, settings: RealtimeConnectionSettings) -> None:
    """The session's settings go to the stage once, here; chunks carry only what changes."""
    reply = await service.client().call(settings.open_request(),
                                        timeout_s=service.config.chunk_timeout_s)
    if not isinstance(reply, RealtimeOpened):
        raise InternalError(f"realtime stage answered {type(reply).__name__} to an open")


async def request_chunk(service: RealtimeService, settings: RealtimeConnectionSettings,
                        controls: ChunkControls, chunk_index: int,
                        started: float) -> GeneratedChunk:
    """One chunk from the stage with these controls; `started` is when sampling began
    (perf_counter), so the preparation time includes it."""
    request = RealtimeChunk(
        request_id=f"{settings.session_id}_{uuid.uuid4().hex}",
        session_id=settings.session_id, chunk_index=chunk_index, prompt=controls.prompt,
        camera=controls.camera, refresh_kv=controls.refresh_kv and chunk_index > 0,
        submitted_at=time.time(),
    )
    prepare_ms = (time.perf_counter() - started) * 1000
    result = await service.client().call(request, timeout_s=service.config.chunk_timeout_s)
    if not isinstance(result, RealtimeChunkResult):
        raise InternalError(f"realtime stage answered {type(result).__name__} to a chunk")
    return GeneratedChunk(
        request_id=request.request_id, chunk_index=chunk_index, event_id=controls.event_id,
        frames=chunk_frames(result), started=started, prepare_ms=prepare_ms,
        forward_ms=result.forward_ms, gpu_queue_ms=result.queue_ms,
        kv_refresh_ms=result.kv_refresh_ms,
    )


def chunk_frames(result: RealtimeChunkResult) -> np.ndarray:
    """The reply's frames as (N, H, W, 3) uint8; InternalError when the byte count is off."""
    shape = (result.num_frames, result.height, result.width, 3)
    if len(result.frames) != int(np.prod(shape)):
        raise InternalError(f"realtime stage sent {len(result.frames)} frame bytes for "
                            f"{result.num_frames} frames of {result.width}x{result.height}")
    return np.frombuffer(result.frames, np.uint8).reshape(shape)
