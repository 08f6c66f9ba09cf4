"""Generation stage engine: the loop is `schedule() -> runner phase -> postprocess()`.

Each `step()` runs one bounded unit: start a batch (prompt encoding + noise), one denoising
step of the running batch, one row's VAE decode, or writing one request's files. Requests are
batched by the scheduler; progress replies follow every step; cancellation applies at the next
step boundary; a request that fails inside a batch is retried alone and then fails alone.
"""

from __future__ import annotations

import logging
import resource
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from worldserve.config import GenerationStageConfig, ServerConfig
from worldserve.engines.common import model_dir, served_model_name
from worldserve.engines.generation.actions import ActionRunner
from worldserve.engines.generation.defaults import sampling_defaults
from worldserve.engines.generation.outputs import output_names, write_output
from worldserve.engines.generation.runner import BatchState, DiffusionRunner, load_pipeline, to_uint8
from worldserve.engines.generation.scheduler import (
    RequestStatus,
    ScheduledRequest,
    Scheduler,
    denoise_progress,
)
from worldserve.engines.generation.warmup import WarmupPlan
from worldserve.models.common import count_parameters
from worldserve.errors import InternalError, InvalidRequest, WorldserveError
from worldserve.ipc.capabilities import (
    ActionHeadCapabilities,
    GenerationCapabilities,
    GenerationDefaults,
)
from worldserve.ipc.messages import (
    ErrorReply,
    GenerateActions,
    GenerateMedia,
    GenerationAccepted,
    GenerationCancelled,
    GenerationProgress,
    GenerationResult,
    Request,
)
from worldserve.runtime.engine import EngineState, ReplyFn

log = logging.getLogger("worldserve.generation")

MAX_WAIT_SLEEP_S = 0.002


@dataclass
class Job:
    """Engine-side payload of a ScheduledRequest."""

    msg: GenerateMedia | None  # None for internal (warmup) requests
    reply: ReplyFn
    started_s: float = 0.0
    frames: list[np.ndarray] = field(default_factory=list)


@dataclass
class RunningBatch:
    requests: list[ScheduledRequest]
    state: BatchState | None = None
    decoded: dict[int, np.ndarray] = field(default_factory=dict)  # row -> uint8 frames
    next_row: int = 0


class GenerationEngine:
    def __init__(self, stage_config: GenerationStageConfig, server_config: ServerConfig,
                 pipe: Any = None) -> None:
        path = model_dir(stage_config)
        self.config = stage_config
        _check_prompt_enhancer(stage_config, server_config)
        self.output_dir = stage_config.resolved_output_dir()
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.pipe = pipe or load_pipeline(str(path), stage_config.dtype,
                                          stage_config.device)
        self.runner = DiffusionRunner(self.pipe)
        self.actions = ActionRunner.load(path)
        self.defaults = sampling_defaults(path)
        self.model_name = served_model_name(stage_config, path)
        self.model_path = str(path)
        self.num_params = count_parameters(self.pipe)
        self.scheduler = Scheduler(stage_config.max_batch_size, stage_config.batch_wait_ms / 1000)
        self.running: RunningBatch | None = None
        self.by_id: dict[str, ScheduledRequest] = {}
        self.action_queue: list[tuple[GenerateActions, ReplyFn]] = []
        self.num_finished = 0
        self.warmup = WarmupPlan.create(stage_config, self.defaults, self.runner)
        for params in self.warmup.requests():
            self._enqueue(f"warmup-{len(self.by_id)}", params, Job(msg=None, reply=self._on_warmup))

    # ------------------------------------------------------------------ protocol

    def capabilities(self) -> GenerationCapabilities:
        return GenerationCapabilities(
            pipeline=type(self.pipe).__name__,
            defaults=GenerationDefaults(**self.defaults.as_dict()),
            size_multiple=self.runner.size_multiple,
            temporal_stride=self.runner.temporal_stride,
            max_batch_size=self.config.max_batch_size,
            image_conditioning=True,
            max_input_images=4,
            output_dir=str(self.output_dir),
            actions=ActionHeadCapabilities(**self.actions.metadata()) if self.actions else None,
        )

    def state(self) -> EngineState:
        return "warming" if self.warmup.blocking and not self.warmup.done else "ready"

    def submit(self, request: Request, reply: ReplyFn) -> None:
        if isinstance(request, GenerateMedia):
            self._submit_media(request, reply)
        elif isinstance(request, GenerateActions):
            if self.actions is None:
                raise InvalidRequest("this checkpoint has no action head")
            self.action_queue.append((request, reply))
        else:
            raise InvalidRequest(f"the generation stage does not handle {type(request).__name__}")

    def _submit_media(self, msg: GenerateMedia, reply: ReplyFn) -> None:
        params = msg.params
        params.num_frames = self.runner.snap_frames(params.num_frames)
        self.runner.check(params)
        output_names(msg.output_stem, msg.output_format, len(params.seeds))  # validates
        position = self._enqueue(msg.request_id, params, Job(msg=msg, reply=reply))
        reply(GenerationAccepted(request_id=msg.request_id, num_frames=params.num_frames,
                                 width=params.width, height=params.height, queue_position=position))

    def _enqueue(self, request_id: str, params: Any, job: Job) -> int:
        request = ScheduledRequest(request_id=request_id, params=params,
                                   arrival_s=self.scheduler.clock(), payload=job)
        self.by_id[request_id] = request
        return self.scheduler.add(request)

    def cancel(self, request_id: str) -> None:
        request = self.by_id.get(request_id)
        if request is None:
            return
        if request.status == RequestStatus.WAITING:
            self.scheduler.remove(request_id)
        elif request.status == RequestStatus.RUNNING and self.running is not None:
            self._drop_from_batch(request)
        else:
            return
        request.transition(RequestStatus.CANCELLED)
        self._finish(request)
        request.payload.reply(GenerationCancelled(request_id=request_id))

    def _drop_from_batch(self, request: ScheduledRequest) -> None:
        batch = self.running
        assert batch is not None
        batch.requests = [r for r in batch.requests if r is not request]
        if batch.state is not None:
            keep = [i for i, owner in enumerate(batch.state.row_owner) if owner != request.request_id]
            batch.decoded = {keep.index(i): v for i, v in batch.decoded.items() if i in keep}
            batch.next_row = sum(1 for i in keep if i < batch.next_row)
            batch.state.keep_rows(keep)
        if not batch.requests:
            self.running = None

    def has_work(self) -> bool:
        return bool(self.running or len(self.scheduler) or self.action_queue)

    def step(self) -> None:
        if self.action_queue:
            msg, reply = self.action_queue.pop(0)
            self._run_actions(msg, reply)
            return
        if self.running is None:
            batch = self.scheduler.schedule()
            if batch is None:
                time.sleep(min(MAX_WAIT_SLEEP_S, self.scheduler.wait_s()))
                return
            self.running = RunningBatch(batch)
        batch = self.running
        try:
            self._advance(batch)
        except Exception as exc:
            self._batch_failed(batch, exc)

    def stats(self) -> dict[str, Any]:
        running = len(self.running.requests) if self.running else 0
        return {"queue_depth": len(self.scheduler) + len(self.action_queue), "running": running,
                "extra": {"finished": self.num_finished, "warmup_done": self.warmup.done}}

    def shutdown(self) -> None:
        for request in list(self.by_id.values()):
            if request.payload.msg is not None:
                request.payload.reply(ErrorReply(request_id=request.request_id,
                                                 code="stage_unavailable",
                                                 message="the generation stage is shutting down"))
        self.by_id.clear()

    # ------------------------------------------------------------------ phases

    def _advance(self, batch: RunningBatch) -> None:
        if batch.state is None:
            self._start(batch)
        elif not batch.state.done_denoising:
            self.runner.denoise_step(batch.state)
            self._report_steps(batch)
        elif batch.next_row < len(batch.state.row_owner):
            row = batch.next_row
            batch.decoded[row] = to_uint8(self.runner.decode(batch.state, row))
            batch.next_row += 1
            if batch.next_row == len(batch.state.row_owner):
                self._report(batch.requests, 95, "decoded")
        else:
            self._finish_one(batch)

    def _start(self, batch: RunningBatch) -> None:
        now = time.perf_counter()
        owners, rows, seeds = [], [], []
        for request in batch.requests:
            request.payload.started_s = now
            for seed in request.params.seeds:
                owners.append(request.request_id)
                rows.append(request.params)
                seeds.append(seed)
        batch.state = self.runner.prepare(owners, rows, seeds)
        self._report(batch.requests, 1, "denoising")

    def _report_steps(self, batch: RunningBatch) -> None:
        state = batch.state
        assert state is not None
        progress = denoise_progress(state.step_index, state.num_steps)
        for request in batch.requests:
            request.steps_done = state.step_index
        self._report(batch.requests, progress, "denoising", state.step_index, state.num_steps)

    def _report(self, requests: list[ScheduledRequest], progress: int, phase: str,
                done: int = 0, total: int = 0) -> None:
        for request in requests:
            if request.payload.msg is None or progress <= request.last_progress:
                continue
            request.last_progress = progress
            request.payload.reply(GenerationProgress(
                request_id=request.request_id, progress=progress, steps_done=done,
                steps_total=total, phase=phase))

    def _finish_one(self, batch: RunningBatch) -> None:
        """Write the first request's files and send its result (one request per step)."""
        request = batch.requests[0]
        state = batch.state
        assert state is not None
        rows = [i for i, owner in enumerate(state.row_owner) if owner == request.request_id]
        job: Job = request.payload
        msg = job.msg
        names: list[str] = []
        if msg is not None:
            self._report([request], 99, "writing")
            names = output_names(msg.output_stem, msg.output_format, len(rows))
            for name, row in zip(names, rows):
                write_output(self.output_dir, name, batch.decoded[row], msg.output_format, msg.fps,
                             msg.compression)
        frames = batch.decoded[rows[0]]
        request.transition(RequestStatus.FINISHED)
        self._drop_from_batch(request)
        self._finish(request)
        job.reply(GenerationResult(
            request_id=request.request_id, file_names=names, width=int(frames.shape[2]),
            height=int(frames.shape[1]), num_frames=int(frames.shape[0]),
            inference_time_s=time.perf_counter() - job.started_s, peak_memory_mb=_peak_memory_mb()))

    def _finish(self, request: ScheduledRequest) -> None:
        self.by_id.pop(request.request_id, None)
        self.num_finished += 1

    # ------------------------------------------------------------------ failures

    def _batch_failed(self, batch: RunningBatch, exc: Exception) -> None:
        self.running = None
        if len(batch.requests) > 1:
            log.warning("a batch of %d requests failed (%s); retrying each alone",
                        len(batch.requests), exc)
            self.scheduler.requeue_alone(batch.requests)
            return
        for request in batch.requests:
            log.warning("request %s failed: %s", request.request_id, exc)
            request.transition(RequestStatus.FAILED)
            self._finish(request)
            error = _as_error(exc)
            request.payload.reply(ErrorReply(request_id=request.request_id, code=error.code,
                                             message=error.message))

    def _run_actions(self, msg: GenerateActions, reply: ReplyFn) -> None:
        assert self.actions is not None  # submit() refuses action requests without a head
        try:
            result = self.actions.run(msg)
        except Exception as exc:
            log.warning("action request %s failed: %s", msg.request_id, exc)
            error = _as_error(exc)
            reply(ErrorReply(request_id=msg.request_id, code=error.code, message=error.message))
            return
        reply(result)

    def _on_warmup(self, reply: Any) -> None:
        self.warmup.on_reply(reply)


def _as_error(exc: Exception) -> WorldserveError:
    if isinstance(exc, WorldserveError):
        return exc
    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, (ValueError, TypeError)):
        return InvalidRequest(first_line)
    return InternalError(first_line)


def _peak_memory_mb() -> float | None:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.max_memory_allocated() / 2**20
    except Exception:  # memory figures are optional; never fail a request for them
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _check_prompt_enhancer(config: GenerationStageConfig, server_config: ServerConfig) -> None:
    """The routes cannot start with a broken enhancer file: the stage fails to start (spec §1.3)."""
    if config.prompt_enhancer is None:
        return
    from worldserve.api.jobs.enhancer import load_enhancer_config

    enhancer = load_enhancer_config(config.prompt_enhancer)
    if enhancer.base_url == "reasoner" and not server_config.stages.reasoner.enabled:
        raise ValueError("prompt_enhancer uses base_url 'reasoner' but the reasoner stage is "
                         "disabled")


def create_engine(stage_config: GenerationStageConfig, server_config: ServerConfig) -> GenerationEngine:
    return GenerationEngine(stage_config, server_config)
