"""The realtime surface's service: engine facts, admission, session settings, release.

Stored in `runtime.services["realtime"]` by the route module's `setup()`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from dataclasses import dataclass

from worldserve.api.realtime.admission import AdmissionManager
from worldserve.api.realtime.inputs import resolve_first_frame
from worldserve.api.runtime import ServerRuntime
from worldserve.api.schemas.realtime import InitRequest, parse_action_dsl, parse_size
from worldserve.config import RealtimeStageConfig
from worldserve.errors import InvalidRequest, WorldserveError
from worldserve.ipc.capabilities import RealtimeCapabilities, capabilities_as
from worldserve.ipc.client import StageClient, new_request_id
from worldserve.ipc.messages import RealtimeOpen, RealtimeRelease
from worldserve.media.fetch import MediaPolicy
from worldserve.media.framing import EncodeSettings

log = logging.getLogger("worldserve.realtime")

STAGE = "realtime"
RELEASE_ATTEMPTS = 3
RELEASE_BACKOFF_S = 0.05
RELEASE_TIMEOUT_S = 5.0
WORKER_ID = "realtime0"


@dataclass(frozen=True)
class RealtimeConnectionSettings:
    """Everything a session needs, resolved from its init and the engine's facts."""

    session_id: str
    trace_id: str
    user: str
    prompt: str
    negative_prompt: str | None
    seed: int
    width: int
    height: int
    fps: int
    num_inference_steps: int | None
    guidance_scale: float
    sink_size: int | None
    window_frames: int | None
    first_frame: bytes | None
    intrinsics: list[float] | None
    initial_script: list[list[str]] | None
    max_chunks: int | None
    pacing: bool
    refresh_kv_default: bool
    encode: EncodeSettings
    kv_bytes: int = 0

    def open_request(self) -> RealtimeOpen:
        """The session-open message: the settings the engine needs, sent once before chunk 0."""
        return RealtimeOpen(
            request_id=f"{self.session_id}_open", session_id=self.session_id,
            prompt=self.prompt, negative_prompt=self.negative_prompt, seed=self.seed,
            width=self.width, height=self.height, num_inference_steps=self.num_inference_steps,
            guidance_scale=self.guidance_scale, sink_size=self.sink_size,
            window_frames=self.window_frames, first_frame=self.first_frame,
            intrinsics=self.intrinsics)


def new_session_id() -> str:
    # Session ids carry their owner so any api replica can route to the right worker.
    return f"sess-{WORKER_ID}-{uuid.uuid4().hex}"


class RealtimeService:
    def __init__(self, runtime: ServerRuntime) -> None:
        self.runtime = runtime
        self.config: RealtimeStageConfig = runtime.config.stages.realtime
        self.media_policy = MediaPolicy.from_config(runtime.config)
        self.admission = AdmissionManager(self.config.max_sessions,
                                          self.config.max_sessions_per_user,
                                          self.config.admission_wait_s,
                                          int(self.config.kv_budget_gib * 2**30))

    def client(self) -> StageClient:
        return self.runtime.client(STAGE)

    def facts(self) -> RealtimeCapabilities:
        info = self.client().info
        return capabilities_as(info.capabilities if info else None, RealtimeCapabilities)

    async def wait_ready(self, poll_s: float = 0.05) -> StageClient:
        """Wait until the realtime stage is warm (StageUnavailable when it is down)."""
        while True:
            client = self.client()
            if client.state == "ready":
                return client
            await asyncio.sleep(poll_s)

    async def build_settings(self, init: InitRequest, facts: RealtimeCapabilities, *,
                             trace_id: str, user: str) -> RealtimeConnectionSettings:
        """Engine-dependent checks of a schema-valid init; raises InvalidRequest."""
        width, height = parse_size(init.size) if init.size else (facts.default_width,
                                                                 facts.default_height)
        _check_size(width, height, facts)
        _check_model_limits(init, facts)
        script = _initial_script(init, facts)
        if init.first_frame is not None and not facts.supports_first_frame:
            raise InvalidRequest(f"first_frame: pipeline {facts.pipeline} is not image-"
                                 "conditioned; remove first_frame", param="first_frame")
        if init.first_frame is None and facts.requires_first_frame:
            raise InvalidRequest(f"first_frame: pipeline {facts.pipeline} starts sessions from "
                                 "an image; first_frame is required", param="first_frame")
        first_frame = await resolve_first_frame(init.first_frame, self.media_policy)
        fmt = init.output_format
        return RealtimeConnectionSettings(
            session_id=new_session_id(), trace_id=trace_id, user=user, prompt=init.prompt,
            negative_prompt=init.negative_prompt, seed=init.seed, width=width, height=height,
            fps=init.fps or facts.default_fps, num_inference_steps=init.num_inference_steps,
            guidance_scale=init.guidance_scale, sink_size=init.realtime_causal_sink_size,
            window_frames=init.realtime_causal_kv_cache_num_frames, first_frame=first_frame,
            intrinsics=_intrinsics(init),
            initial_script=script, max_chunks=init.max_chunks,
            pacing=init.realtime_output_pacing,
            refresh_kv_default=init.realtime_prompt_refresh_kv,
            encode=EncodeSettings(fmt=fmt, delta_level=init.realtime_delta_level,
                                  quality=init.output_compression,
                                  preview_max_width=init.realtime_preview_max_width),
            kv_bytes=facts.kv_bytes(width, height, init.realtime_causal_kv_cache_num_frames),
        )

    async def release_session(self, session_id: str) -> bool:
        """RealtimeRelease, retried with 50 ms x attempt back-off; False when it never landed."""
        for attempt in range(1, RELEASE_ATTEMPTS + 1):
            try:
                client = self.client()
                await client.call(RealtimeRelease(request_id=new_request_id("rtrel"),
                                                  session_id=session_id),
                                  timeout_s=RELEASE_TIMEOUT_S)
                return True
            except WorldserveError as exc:
                log.warning("release of %s failed (attempt %d/%d): %s", session_id, attempt,
                            RELEASE_ATTEMPTS, exc.message)
            if attempt < RELEASE_ATTEMPTS:
                await asyncio.sleep(RELEASE_BACKOFF_S * attempt)
        return False


def _check_size(width: int, height: int, facts: RealtimeCapabilities) -> None:
    multiple = facts.size_multiple
    if width > facts.max_width or height > facts.max_height:
        raise InvalidRequest(f"size: {width}x{height} exceeds the limit "
                             f"{facts.max_width}x{facts.max_height}", param="size")
    if width % multiple or height % multiple:
        raise InvalidRequest(f"size: {width}x{height} must be a multiple of {multiple} in both "
                             "dimensions", param="size")


def _check_model_limits(init: InitRequest, facts: RealtimeCapabilities) -> None:
    sink, window = init.realtime_causal_sink_size, init.realtime_causal_kv_cache_num_frames
    if sink is not None or window is not None:  # an override is checked with the defaults
        sink = sink if sink is not None else (facts.default_sink_frames or 0)
        window = window if window is not None else facts.default_window_frames
    if window is not None and window < (sink or 0) + facts.latent_frames_per_block:
        raise InvalidRequest(
            f"realtime_causal_kv_cache_num_frames: window {window} must be >= sink "
            f"({sink or 0}) + frames per block ({facts.latent_frames_per_block})",
            param="realtime_causal_kv_cache_num_frames")
    if window is not None and facts.max_window_frames and window > facts.max_window_frames:
        raise InvalidRequest(f"realtime_causal_kv_cache_num_frames: {window} exceeds "
                             f"{facts.max_window_frames}",
                             param="realtime_causal_kv_cache_num_frames")
    steps = init.num_inference_steps
    if steps is not None and facts.max_inference_steps and steps > facts.max_inference_steps:
        raise InvalidRequest(f"num_inference_steps: {steps} exceeds {facts.max_inference_steps}",
                             param="num_inference_steps")
    if init.guidance_scale < 1.0:
        raise InvalidRequest(f"guidance_scale must be >= 1.0 (1.0: no guidance), got "
                             f"{init.guidance_scale:g}", param="guidance_scale")
    if not facts.supports_guidance and init.guidance_scale != 1.0:
        raise InvalidRequest(f"guidance_scale: pipeline {facts.pipeline} is guidance-distilled; "
                             f"use 1.0 (got {init.guidance_scale:g})", param="guidance_scale")


def _intrinsics(init: InitRequest) -> list[float] | None:
    """`condition_inputs.intrinsics` as [fx, fy, cx, cy] (a 3x3 K matrix is converted)."""
    raw = init.condition_inputs.intrinsics if init.condition_inputs else None
    if raw is None:
        return None
    values = raw
    if len(raw) == 3 and all(isinstance(row, list) and len(row) == 3 for row in raw):
        values = [raw[0][0], raw[1][1], raw[0][2], raw[1][2]]
    ok = len(values) == 4 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        for v in values)
    if not ok or values[0] <= 0 or values[1] <= 0:
        raise InvalidRequest("condition_inputs.intrinsics: give [fx, fy, cx, cy] (or a 3x3 K "
                             "matrix) in first_frame pixels, with fx, fy > 0",
                             param="condition_inputs.intrinsics")
    return [float(v) for v in values]


def _initial_script(init: InitRequest, facts: RealtimeCapabilities) -> list[list[str]] | None:
    inputs = init.condition_inputs
    if inputs is None or (inputs.camera_actions is None and inputs.action is None):
        return None
    if not facts.camera_conditioning:
        raise InvalidRequest(f"condition_inputs: pipeline {facts.pipeline} has no camera "
                             "conditioning", param="condition_inputs")
    if inputs.action is not None:
        try:
            return parse_action_dsl(inputs.action, facts.max_script_frames)
        except ValueError as exc:
            raise InvalidRequest(str(exc), param="condition_inputs.action") from None
    script = [list(keys) for keys in inputs.camera_actions or []]
    if len(script) > facts.max_script_frames:
        raise InvalidRequest(f"condition_inputs.camera_actions: {len(script)} frames; the limit "
                             f"is {facts.max_script_frames}", param="condition_inputs")
    return script
