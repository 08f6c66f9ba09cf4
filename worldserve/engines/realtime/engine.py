"""Realtime stage engine: causal video sessions driven chunk by chunk.

`submit()` validates a `RealtimeOpen` (the session's settings, once) and keeps them for chunk
0, or queues a `RealtimeChunk`; `step()` runs one chunk of one session on the runner (chunk 0
first builds the session's state), round-robin across sessions with pending chunks;
`RealtimeRelease` frees a session's state at once. Contract: spec realtime-video.md sections
6 (per-session state), 7 (several sessions) and 9 (readiness).
"""

from __future__ import annotations

import io
import logging
import time
from collections import OrderedDict
from typing import Any

from worldserve.config import RealtimeStageConfig, ServerConfig
from worldserve.engines.common import model_dir, served_model_name, unsupported
from worldserve.engines.realtime.contract import RealtimeRunner, WorldSession
from worldserve.engines.realtime.scheduler import PendingChunk, RoundRobinQueue
from worldserve.engines.realtime.session import SessionTable
from worldserve.errors import InvalidRequest, NotFound, WorldserveError
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
from worldserve.models import registry
from worldserve.models.types import ChunkRunOutput, WorldSessionSettings
from worldserve.runtime.devices import resolve_in_process
from worldserve.runtime.engine import EngineState, ReplyFn

log = logging.getLogger("worldserve.realtime")


def warmup_image(size: int = 64) -> bytes:
    """A small gray PNG: warm-up sessions of models that start from an image."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (size, size), (128, 128, 128)).save(buffer, format="PNG")
    return buffer.getvalue()


class RealtimeEngine:
    def __init__(self, stage_config: RealtimeStageConfig, server_config: ServerConfig,
                 runner: RealtimeRunner | None = None) -> None:
        stage_config = resolve_in_process(stage_config)  # `auto` device/dtype, built by hand
        if runner is None:
            path = model_dir(stage_config)
            runner = registry.load_runner("realtime", path, dtype=stage_config.dtype,
                                          device=stage_config.device)
            self.model_name = served_model_name(stage_config, path)
            self.model_path = str(path)
        else:  # in-process use (tests, benchmarks)
            self.model_name, self.model_path = "in-memory", ""
        self.cfg = stage_config
        self.runner: RealtimeRunner = runner
        self.model = runner.model
        self.facts = runner.facts
        self.num_params = runner.num_params
        self.sessions = SessionTable(stage_config.max_sessions + stage_config.session_table_margin)
        # Validated settings and prompt of opened sessions waiting for their chunk 0, oldest
        # first (bounded like the table: an open whose chunk 0 never comes is dropped).
        self.opened: OrderedDict[str, tuple[WorldSessionSettings, str]] = OrderedDict()
        self.queue = RoundRobinQueue()
        mc = self.facts
        self.frames_per_block = stage_config.frames_per_block or mc.frames_per_block
        self.default_sink = (stage_config.sink_frames if stage_config.sink_frames is not None
                             else mc.default_sink_frames)
        self.default_window = stage_config.window_frames or mc.default_window_frames
        self.default_steps = stage_config.num_inference_steps or mc.default_num_inference_steps
        self._check_window(self.default_sink, self.default_window, "stage default")
        if stage_config.warmup_mode == "server":
            self._warmup()

    # ------------------------------------------------------------------ facts

    def capabilities(self) -> RealtimeCapabilities:
        mc = self.facts
        return RealtimeCapabilities(
            pipeline=mc.pipeline,
            realtime_supported=True,
            frames_per_chunk=self.runner.chunk_frames(1, self.frames_per_block),
            first_chunk_frames=self.runner.chunk_frames(0, self.frames_per_block),
            latent_frames_per_block=self.frames_per_block,
            temporal_upsampling=self.runner.upsampling,
            default_fps=mc.default_fps,
            default_width=mc.default_width,
            default_height=mc.default_height,
            default_num_inference_steps=self.default_steps,
            max_inference_steps=self.cfg.max_inference_steps,
            default_sink_frames=self.default_sink,
            default_window_frames=self.default_window,
            max_window_frames=mc.max_window_frames,
            camera_conditioning=mc.camera_conditioning,
            camera_keys=mc.camera_keys,
            supports_first_frame=mc.first_frame != "unsupported",
            requires_first_frame=mc.first_frame == "required",
            supports_guidance=mc.guidance,
            max_script_frames=mc.max_script_frames,
            min_pulse_items=mc.min_pulse_items,
            max_width=self.cfg.max_width,
            max_height=self.cfg.max_height,
            size_multiple=mc.size_multiple,
            # KV estimate for admission (spec 7.1): bytes = kv_bytes_per_token x window x
            # (width / size_multiple) x (height / size_multiple).
            kv_bytes_per_token=mc.kv_bytes_per_token,
        )

    def state(self) -> EngineState:
        return "ready"

    def stats(self) -> dict[str, Any]:
        sessions = self.sessions.values()
        return {"queue_depth": len(self.queue), "running": 0, "sessions": len(sessions),
                "extra": {"kv_tokens": sum(s.cache.num_tokens for s in sessions),
                          "kv_bytes": sum(s.cache.nbytes() for s in sessions)}}

    # ------------------------------------------------------------------ requests

    def submit(self, request: Request, reply: ReplyFn) -> None:
        if isinstance(request, RealtimeChunk):
            self._submit_chunk(request, reply)
        elif isinstance(request, RealtimeOpen):
            self._open(request)
            reply(RealtimeOpened(request_id=request.request_id, session_id=request.session_id))
        elif isinstance(request, RealtimeRelease):
            existed = self.release(request.session_id)
            reply(RealtimeReleased(request_id=request.request_id,
                                   session_id=request.session_id, existed=existed))
        else:
            raise unsupported(request, "realtime")

    def _open(self, request: RealtimeOpen) -> None:
        """Validate the settings now (spec 3.1 / 6.3 bounds); chunk 0 builds the state."""
        settings = self._settings(request)
        self.opened.pop(request.session_id, None)
        self.opened[request.session_id] = (settings, request.prompt)
        while len(self.opened) > self.sessions.capacity:
            self.opened.popitem(last=False)

    def _submit_chunk(self, request: RealtimeChunk, reply: ReplyFn) -> None:
        if request.chunk_index < 0:
            raise InvalidRequest(f"chunk_index must be >= 0, got {request.chunk_index}")
        sid = request.session_id
        known = sid in self.opened or (request.chunk_index > 0 and sid in self.sessions)
        if not known:
            what = "opened" if request.chunk_index == 0 else "found"
            raise NotFound(f"realtime session {sid} not {what}")
        self.queue.push(PendingChunk(request, reply))

    def release(self, session_id: str) -> bool:
        """Free every state of the session and drop its queued chunks (idempotent)."""
        for item in self.queue.drop_session(session_id):
            self._fail(item, NotFound(f"realtime session {session_id} was released"))
        opened = self.opened.pop(session_id, None) is not None
        return (self.sessions.pop(session_id) is not None) or opened

    def cancel(self, request_id: str) -> None:
        self.queue.drop_request(request_id)

    def has_work(self) -> bool:
        return len(self.queue) > 0

    def step(self) -> None:
        """schedule (the next session's oldest chunk) -> execute (one chunk on the runner) ->
        update (the reply)."""
        item = self.queue.pop()
        if item is None:
            return
        started = time.monotonic()
        try:
            session = self._session_for(item)
            out = self.runner.run_chunk(session, item.request.camera,
                                        item.request.prompt if item.request.chunk_index else None,
                                        item.request.refresh_kv)
        except WorldserveError as exc:
            if item.request.chunk_index == 0:  # a session whose first chunk failed has no state
                self.sessions.pop(item.request.session_id)
            self._fail(item, exc)
            return
        except Exception as exc:  # a failed chunk ends its session, never the stage
            log.exception("realtime chunk %s failed", item.request.request_id)
            self.release(item.request.session_id)
            item.reply(ErrorReply(request_id=item.request.request_id, code="internal_error",
                                  message=str(exc).splitlines()[0] if str(exc) else repr(exc)))
            return
        self._reply(item, session, out, started)

    def shutdown(self) -> None:
        for session in self.sessions.values():
            self.release(session.session_id)
        self.opened.clear()

    # ------------------------------------------------------------------ internals

    def _warmup(self) -> None:
        """Spec section 9: a synthetic 2-chunk session per warm-up size (no camera, then
        released) before the stage reports ready; the generator's kernels are warm after it."""
        sizes = self.cfg.warmup_sizes or [f"{self.facts.default_width}x"
                                          f"{self.facts.default_height}"]
        image = warmup_image() if self.facts.first_frame == "required" else None
        for size in sizes:
            width, height = (int(v) for v in size.split("x"))
            sid = f"warmup-{size}"
            self.submit(RealtimeOpen(request_id=f"{sid}-open", session_id=sid, prompt="warmup",
                                     width=width, height=height, first_frame=image),
                        lambda _reply: None)
            for k in range(2):
                self.submit(RealtimeChunk(request_id=f"{sid}-{k}", session_id=sid, chunk_index=k),
                            lambda _reply: None)
            while self.has_work():
                self.step()
            self.release(sid)
        log.info("realtime warm-up done for %s", ", ".join(sizes))

    def _session_for(self, item: PendingChunk) -> WorldSession:
        """Chunk 0 builds the state of the opened session; later chunks must come in order."""
        req = item.request
        if req.chunk_index == 0:
            opened = self.opened.pop(req.session_id, None)
            if opened is None:  # dropped by the bound on opens while its chunk 0 waited
                raise NotFound(f"realtime session {req.session_id} not opened")
            settings, prompt = opened
            session = self.runner.new_session(req.session_id, settings, req.prompt or prompt)
            for evicted in self.sessions.put(session):
                log.warning("session table full: released least recently used session %s",
                            evicted.session_id)
                self.release(evicted.session_id)
            return session
        session = self.sessions.get(req.session_id)
        if session is None:
            raise NotFound(f"realtime session {req.session_id} not found")
        if req.chunk_index != session.next_chunk:
            raise InvalidRequest(f"realtime session {req.session_id} expects chunk "
                                 f"{session.next_chunk}, got {req.chunk_index}")
        return session

    def _reply(self, item: PendingChunk, session: WorldSession, out: ChunkRunOutput,
               started: float) -> None:
        req = item.request
        item.reply(RealtimeChunkResult(
            request_id=req.request_id, session_id=req.session_id, chunk_index=req.chunk_index,
            frames=out.frames, num_frames=out.num_frames, width=session.settings.width,
            height=session.settings.height, forward_ms=out.forward_ms,
            queue_ms=(started - item.received_at) * 1000, kv_refresh_ms=out.kv_refresh_ms,
            cached_frames=session.cache.num_frames))

    def _fail(self, item: PendingChunk, exc: WorldserveError) -> None:
        item.reply(ErrorReply(request_id=item.request.request_id, code=exc.code,
                              message=exc.message))

    def _settings(self, req: RealtimeOpen) -> WorldSessionSettings:
        """Validate a session's settings (spec 3.1 / 6.3 bounds)."""
        mc = self.facts
        width = req.width or mc.default_width
        height = req.height or mc.default_height
        self._check_size(width, height)
        steps = req.num_inference_steps or self.default_steps
        if not 1 <= steps <= self.cfg.max_inference_steps:
            raise InvalidRequest("num_inference_steps must be in "
                                 f"1..{self.cfg.max_inference_steps},"
                                 f" got {steps}")
        sink = self.default_sink if req.sink_size is None else req.sink_size
        window = self.default_window if req.window_frames is None else req.window_frames
        self._check_window(sink, window, "realtime_causal")
        self._check_conditioning(req)
        return WorldSessionSettings(seed=req.seed, width=width, height=height,
                                    num_inference_steps=steps, sink_frames=sink,
                                    window_frames=window, frames_per_block=self.frames_per_block,
                                    guidance_scale=req.guidance_scale,
                                    negative_prompt=req.negative_prompt or "",
                                    first_frame=req.first_frame,
                                    intrinsics=tuple(req.intrinsics) if req.intrinsics else None)

    def _check_conditioning(self, req: RealtimeOpen) -> None:
        """first_frame and guidance_scale against what the checkpoint declares."""
        mc = self.facts
        if req.guidance_scale != 1.0 and not mc.guidance:
            raise InvalidRequest(f"guidance_scale must be 1.0 for {mc.pipeline}, a few-step "
                                 f"model distilled without CFG; got {req.guidance_scale}")
        if req.guidance_scale < 1.0:
            raise InvalidRequest(f"guidance_scale must be >= 1.0, got {req.guidance_scale}")
        if req.first_frame is not None and mc.first_frame == "unsupported":
            raise InvalidRequest(f"{mc.pipeline} is text-to-video: first_frame is not "
                                 "supported")
        if req.first_frame is None and mc.first_frame == "required":
            raise InvalidRequest(f"{mc.pipeline} sessions start from an image: first_frame is "
                                 "required in the init")

    def _check_size(self, width: int, height: int) -> None:
        m = self.facts.size_multiple
        for name, value, limit in (("width", width, self.cfg.max_width),
                                   ("height", height, self.cfg.max_height)):
            if value < m or value > limit or value % m:
                raise InvalidRequest(f"{name} must be a multiple of {m} in {m}..{limit}, "
                                     f"got {value}")

    def _check_window(self, sink: int, window: int, where: str) -> None:
        block = self.frames_per_block
        limit = self.facts.max_window_frames
        if sink < 0:
            raise InvalidRequest(f"{where} sink size must be >= 0 latent frames, got {sink}")
        if window <= 0 or window < sink + block or window > limit:
            raise InvalidRequest(
                f"{where} window ({window} latent frames) must be > 0, >= sink ({sink}) + frames "
                f"per block ({block}) and <= {limit}")

