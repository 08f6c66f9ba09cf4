"""Realtime world-session messages; see the package docstring."""

from __future__ import annotations

from worldserve.ipc.messages.base import (
    Reply,
    Request,
)

# --------------------------------------------------------------------------- realtime
# Contract: shared/spec/realtime-video.md. The api process owns the WebSocket protocol, control
# queues (script/state/DSL -> one key list per output frame), framing/encoding, pacing and
# admission; the realtime engine owns per-session causal state (KV sink + window, latents,
# streaming VAE decode) and produces raw RGB24 frames chunk by chunk.


class RealtimeOpen(Request):
    """Open (or reset) a session: its settings, sent once, before chunk 0. The engine validates
    them at once (an invalid one is an error reply) and answers `RealtimeOpened`; chunk 0 then
    builds the session's state under them."""

    session_id: str
    prompt: str = ""
    negative_prompt: str | None = None
    seed: int = 42
    width: int = 0
    height: int = 0
    num_inference_steps: int | None = None
    guidance_scale: float = 1.0
    sink_size: int | None = None
    window_frames: int | None = None
    first_frame: bytes | None = None
    # [fx, fy, cx, cy] in first_frame pixels (camera-conditioned image models)
    intrinsics: list[float] | None = None


class RealtimeOpened(Reply):
    session_id: str


class RealtimeChunk(Request):
    """Generate chunk `chunk_index` of an opened session: only what changes per chunk. Chunk 0
    of a session that was not opened, and chunk k > 0 of an unknown session, fail with
    `not_found`. `camera` holds one key list per output frame of this chunk (the actions; None:
    no camera control). `prompt` switches the prompt from this chunk on (on chunk 0 it replaces
    the open's); `refresh_kv` also rebuilds the self-attention cache under it."""

    session_id: str
    chunk_index: int
    prompt: str | None = None
    camera: list[list[str]] | None = None
    refresh_kv: bool = False
    submitted_at: float = 0.0


class RealtimeChunkResult(Reply):
    """`frames`: `num_frames` raw RGB24 frames of `height x width`, concatenated."""

    session_id: str
    chunk_index: int
    frames: bytes
    num_frames: int
    width: int
    height: int
    forward_ms: float
    queue_ms: float = 0.0
    kv_refresh_ms: float | None = None
    cached_frames: int = 0


class RealtimeRelease(Request):
    """Free every state of the session (idempotent). Reply: `RealtimeReleased`."""

    session_id: str


class RealtimeReleased(Reply):
    session_id: str
    existed: bool


