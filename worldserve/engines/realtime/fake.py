"""`fake` realtime backend: deterministic synthetic frames behind the real wire contract.

Same messages (RealtimeOpen -> RealtimeOpened, RealtimeChunk -> RealtimeChunkResult,
RealtimeRelease -> RealtimeReleased), same session rules (chunk 0 of an opened session creates
or resets its state, chunk k > 0 of an unknown session fails with `not_found`, release is
idempotent, the session table is bounded LRU) and the same
capabilities shape as the causal engine, so protocol tests are fast and exact.

Frames are a gradient that moves with the camera keys and advances one pixel per frame:
red = x + camera_x + frame, green = y + camera_y, blue = a tint derived from the prompt,
the seed and (when given) the first frame. `render_frames` is pure, so tests recompute
exactly what a chunk must contain.

Test knobs (`stages.realtime.server_args_overrides`): `frames_per_chunk` (12),
`min_pulse_items` (1), `fake_forward_ms` (0: extra time per chunk), `fake_camera` (true),
`fake_realtime_supported` (true), `fake_lose_session_seed` (sessions with this seed lose
their state after chunk 1, as if a release or an eviction had happened).
"""

from __future__ import annotations

import collections
import hashlib
import io
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from worldserve.config import RealtimeStageConfig, ServerConfig
from worldserve.errors import InvalidRequest, NotFound
from worldserve.ipc.capabilities import RealtimeCapabilities
from worldserve.ipc.messages import (
    ErrorReply,
    RealtimeChunk,
    RealtimeChunkResult,
    RealtimeOpen,
    RealtimeOpened,
    RealtimeRelease,
    RealtimeReleased,
    Request,
)
from worldserve.runtime.engine import EngineState, ReplyFn

LATENT_FRAMES_PER_CHUNK = 3
DEFAULTS = {"width": 832, "height": 480, "fps": 16, "steps": 4, "sink": 0, "window": 21}
# Pixels per output frame for each held key: (dx, dy).
KEY_MOTION: dict[str, tuple[int, int]] = {
    "a": (-4, 0), "d": (4, 0), "w": (0, -4), "s": (0, 4),
    "j": (-8, 0), "l": (8, 0), "i": (0, -8), "k": (0, 8),
}


@dataclass
class FakeSessionState:
    """Per-session state: the camera position and the frame frontier."""

    tint: int
    seed: int
    width: int
    height: int
    window_frames: int
    camera_x: int = 0
    camera_y: int = 0
    next_frame: int = 0
    next_chunk: int = 0
    last_used: float = 0.0


def prompt_tint(prompt: str, seed: int, first_frame_mean: int = 0) -> int:
    digest = hashlib.sha256(f"{seed}:{prompt}".encode()).digest()
    return (digest[0] + first_frame_mean) % 256


def render_frames(state: FakeSessionState, camera: list[list[str]] | None,
                  num_frames: int) -> np.ndarray:
    """Advance `state` by `num_frames` frames; returns (N, H, W, 3) uint8."""
    frames = np.empty((num_frames, state.height, state.width, 3), np.uint8)
    xs = np.arange(state.width, dtype=np.int64)[None, :]  # (1, W)
    ys = np.arange(state.height, dtype=np.int64)[:, None]  # (H, 1)
    for i in range(num_frames):
        for key in (camera[i] if camera and i < len(camera) else []):
            dx, dy = KEY_MOTION.get(key, (0, 0))
            state.camera_x += dx
            state.camera_y += dy
        frames[i, :, :, 0] = (xs + state.camera_x + state.next_frame) % 256
        frames[i, :, :, 1] = (ys + state.camera_y) % 256
        frames[i, :, :, 2] = state.tint
        state.next_frame += 1
    return frames


def _first_frame_mean(data: bytes) -> int:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            return int(np.asarray(img.convert("RGB")).mean())
    except (UnidentifiedImageError, OSError) as exc:
        raise InvalidRequest(f"first_frame is not a decodable image: {exc}") from None


class FakeRealtimeEngine:
    """Implements the `Engine` protocol for the realtime stage without a model."""

    def __init__(self, stage_config: RealtimeStageConfig, server_config: ServerConfig) -> None:
        opts = stage_config.server_args_overrides
        self.frames_per_chunk = int(opts.get("frames_per_chunk", 12))
        self.min_pulse_items = int(opts.get("min_pulse_items", 1))
        self.forward_s = float(opts.get("fake_forward_ms", 0.0)) / 1000
        self.camera = bool(opts.get("fake_camera", True))
        self.realtime_supported = bool(opts.get("fake_realtime_supported", True))
        self.lose_session_seed = opts.get("fake_lose_session_seed")
        self.max_sessions = stage_config.max_sessions + stage_config.session_table_margin
        self.model_name = stage_config.served_model_name or "fake-realtime"
        self.model_path = str(stage_config.model_path or "")
        self.num_params = 0
        self._sessions: collections.OrderedDict[str, FakeSessionState] = collections.OrderedDict()
        self._opened: collections.OrderedDict[str, RealtimeOpen] = collections.OrderedDict()
        self._queue: collections.deque[tuple[RealtimeChunk, ReplyFn, float]] = collections.deque()

    def capabilities(self) -> RealtimeCapabilities:
        """Same fields as the causal engine (see notes/rt-engine.md)."""
        return RealtimeCapabilities(
            pipeline="FakeRealtimePipeline",
            realtime_supported=self.realtime_supported,
            frames_per_chunk=self.frames_per_chunk,
            first_chunk_frames=self.frames_per_chunk,
            latent_frames_per_block=LATENT_FRAMES_PER_CHUNK,
            temporal_upsampling=4,
            default_fps=DEFAULTS["fps"],
            default_width=DEFAULTS["width"],
            default_height=DEFAULTS["height"],
            default_num_inference_steps=DEFAULTS["steps"],
            max_inference_steps=50,
            default_sink_frames=DEFAULTS["sink"],
            default_window_frames=DEFAULTS["window"],
            max_window_frames=64,
            camera_conditioning=self.camera,
            camera_keys="wasdijkl",
            supports_first_frame=True,
            supports_guidance=True,
            max_script_frames=512,
            min_pulse_items=self.min_pulse_items,
            max_width=4096,
            max_height=4096,
            size_multiple=16,
            kv_bytes_per_token=0,
        )

    def state(self) -> EngineState:
        return "ready"

    def submit(self, request: Request, reply: ReplyFn) -> None:
        if isinstance(request, RealtimeRelease):
            existed = self._release(request.session_id)
            reply(RealtimeReleased(request_id=request.request_id, session_id=request.session_id,
                                   existed=existed))
        elif isinstance(request, RealtimeOpen):
            self._opened.pop(request.session_id, None)
            self._opened[request.session_id] = request
            while len(self._opened) > self.max_sessions:
                self._opened.popitem(last=False)
            reply(RealtimeOpened(request_id=request.request_id, session_id=request.session_id))
        elif isinstance(request, RealtimeChunk):
            self._queue.append((request, reply, time.monotonic()))
        else:
            raise InvalidRequest(f"stage 'realtime' does not handle {type(request).__name__}")

    def _release(self, session_id: str) -> bool:
        self._queue = collections.deque(q for q in self._queue if q[0].session_id != session_id)
        opened = self._opened.pop(session_id, None) is not None
        return self._sessions.pop(session_id, None) is not None or opened

    def cancel(self, request_id: str) -> None:
        self._queue = collections.deque(q for q in self._queue if q[0].request_id != request_id)

    def has_work(self) -> bool:
        return bool(self._queue)

    def step(self) -> None:
        """One chunk of one session (FIFO across sessions: each has at most one pending)."""
        request, reply, queued_at = self._queue.popleft()
        started = time.monotonic()
        try:
            result = self._run_chunk(request, queue_ms=(started - queued_at) * 1000)
        except (InvalidRequest, NotFound) as exc:
            reply(ErrorReply(request_id=request.request_id, code=exc.code, message=exc.message))
            return
        reply(result)

    def _run_chunk(self, req: RealtimeChunk, queue_ms: float) -> RealtimeChunkResult:
        started = time.perf_counter()
        state, kv_refresh_ms = self._session_for(req)
        frames = render_frames(state, req.camera, self.frames_per_chunk)
        state.next_chunk += 1
        state.last_used = time.monotonic()
        if self.forward_s:
            time.sleep(self.forward_s)
        cached = min(state.window_frames, state.next_chunk * LATENT_FRAMES_PER_CHUNK)
        if self.lose_session_seed is not None and state.seed == self.lose_session_seed \
                and req.chunk_index >= 1:
            self._sessions.pop(req.session_id, None)
        return RealtimeChunkResult(
            request_id=req.request_id, session_id=req.session_id, chunk_index=req.chunk_index,
            frames=frames.tobytes(), num_frames=len(frames), width=state.width,
            height=state.height, forward_ms=(time.perf_counter() - started) * 1000,
            queue_ms=queue_ms, kv_refresh_ms=kv_refresh_ms, cached_frames=cached,
        )

    def _session_for(self, req: RealtimeChunk) -> tuple[FakeSessionState, float | None]:
        if req.chunk_index == 0:
            return self._create(req), None
        state = self._sessions.get(req.session_id)
        if state is None:
            raise NotFound(f"realtime session {req.session_id} not found")
        if req.chunk_index != state.next_chunk:
            raise InvalidRequest(f"chunk {req.chunk_index} of session {req.session_id} is out "
                                 f"of order (expected {state.next_chunk})")
        self._sessions.move_to_end(req.session_id)
        if req.prompt is None:
            return state, None
        refresh_started = time.perf_counter()
        state.tint = prompt_tint(req.prompt, state.seed)
        refresh_ms = (time.perf_counter() - refresh_started) * 1000 if req.refresh_kv else None
        return state, refresh_ms

    def _create(self, req: RealtimeChunk) -> FakeSessionState:
        opened = self._opened.pop(req.session_id, None)
        if opened is None:
            raise NotFound(f"realtime session {req.session_id} not opened")
        mean = _first_frame_mean(opened.first_frame) if opened.first_frame else 0
        self._sessions.pop(req.session_id, None)
        while len(self._sessions) >= self.max_sessions:
            self._sessions.popitem(last=False)  # least recently used first
        state = FakeSessionState(
            tint=prompt_tint(req.prompt or opened.prompt, opened.seed, mean), seed=opened.seed,
            width=opened.width or DEFAULTS["width"], height=opened.height or DEFAULTS["height"],
            window_frames=opened.window_frames or DEFAULTS["window"],
        )
        self._sessions[req.session_id] = state
        return state

    def stats(self) -> dict[str, Any]:
        return {"queue_depth": len(self._queue), "running": 0, "sessions": len(self._sessions)}

    def shutdown(self) -> None:
        self._sessions.clear()
        self._opened.clear()
        self._queue.clear()
