"""Generation stage engine: each `step()` is `schedule -> execute -> update`.

`schedule` picks one unit: an action request, a new batch to start (when fewer than
`max_running_requests` requests run), or the next phase of a running batch, round-robin over
the running batches. `execute` runs that one runner phase (prepare, one denoising step, one
row's decode, or writing one request's files); `update` turns its output into replies.
Several batches run at once, each advanced one phase per turn, so a short request is not stuck
behind a long one; cancellation applies at the next step boundary; a request that fails inside
a batch is retried alone and then fails alone.
"""

from __future__ import annotations

import logging
import resource
import time
from pathlib import Path
from typing import Any

from worldserve.config import GenerationStageConfig, ServerConfig
from worldserve.engines.common import model_dir, served_model_name
from worldserve.engines.generation.admin import GenerationAdmin
from worldserve.engines.generation.batch import (
    MediaJob,
    Phase,
    RunnerOutput,
    RunningBatch,
    SchedulerOutput,
)
from worldserve.engines.generation.contract import ActionRunner, GenerationRunner
from worldserve.engines.generation.defaults import sampling_defaults
from worldserve.engines.generation.outputs import (
    action_output,
    output_names,
    to_uint8,
    write_output,
)
from worldserve.engines.generation.scheduler import (
    RequestStatus,
    ScheduledRequest,
    Scheduler,
    denoise_progress,
)
from worldserve.engines.generation.warmup import WarmupPlan
from worldserve.enhancer_config import load_enhancer_config
from worldserve.errors import InternalError, InvalidRequest, WorldserveError
from worldserve.ipc.capabilities import (
    ActionHeadCapabilities,
    GenerationCapabilities,
    GenerationDefaults,
)
from worldserve.ipc.messages import (
    AdminRequest,
    ErrorReply,
    GenerateActions,
    GenerateMedia,
    GenerationAccepted,
    GenerationCancelled,
    GenerationProgress,
    GenerationResult,
    Request,
)
from worldserve.models import registry
from worldserve.models.types import feature_capabilities
from worldserve.runtime.engine import EngineState, ReplyFn

log = logging.getLogger("worldserve.generation")

MAX_WAIT_SLEEP_S = 0.002
ACTION_HEAD_DIR = "action_head"  # optional sub-directory of the generation checkpoint


class GenerationEngine:
    def __init__(self, stage_config: GenerationStageConfig, server_config: ServerConfig,
                 runner: GenerationRunner | None = None) -> None:
        path = model_dir(stage_config)
        self.config = stage_config
        _check_prompt_enhancer(stage_config, server_config)
        self.output_dir = stage_config.resolved_output_dir()
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.runner: GenerationRunner = runner or registry.load_runner(
            "generation", path, dtype=stage_config.dtype, device=stage_config.device,
            safety_checker=stage_config.safety_checker)
        self.pipe = self.runner.pipe
        self.actions = _load_actions(path)
        self.defaults = sampling_defaults(path, self.runner.features.family)
        self.model_name = served_model_name(stage_config, path)
        self.model_path = str(path)
        self.num_params = self.runner.num_params
        self.scheduler = Scheduler(_rows_per_batch(stage_config, self.runner),
                                   stage_config.batch_wait_ms / 1000)
        self.running: list[RunningBatch] = []
        self._turn = 0  # round-robin cursor over `running`
        self.by_id: dict[str, ScheduledRequest] = {}
        self.action_queue: list[tuple[GenerateActions, ReplyFn]] = []
        self.num_finished = 0
        self.admin = GenerationAdmin(self)
        self.warmup = WarmupPlan.create(stage_config, self.defaults, self.runner)
        for params in self.warmup.requests():
            self._enqueue(f"warmup-{len(self.by_id)}", params,
                          MediaJob(msg=None, reply=self._on_warmup))

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
            **feature_capabilities(self.runner.features, action_head=self.actions is not None),
        )

    def state(self) -> EngineState:
        if self.admin.released:
            return "released"
        return "warming" if self.warmup.blocking and not self.warmup.done else "ready"

    def submit(self, request: Request, reply: ReplyFn) -> None:
        if isinstance(request, AdminRequest):
            self.admin.submit(request, reply)
        elif isinstance(request, GenerateMedia):
            self._submit_media(request, reply)
        elif isinstance(request, GenerateActions):
            self._submit_actions(request, reply)
        else:
            raise InvalidRequest(f"the generation stage does not handle {type(request).__name__}")

    def _submit_actions(self, msg: GenerateActions, reply: ReplyFn) -> None:
        if self.actions is None:
            raise InvalidRequest("this checkpoint has no action head")
        self.admin.check_servable()
        if msg.lora:
            raise InvalidRequest("this model's action head does not use LoRA adapters (they "
                                 "apply to the generation transformer)", param="lora")
        self.action_queue.append((msg, reply))

    def _submit_media(self, msg: GenerateMedia, reply: ReplyFn) -> None:
        self.admin.check_servable()
        params = msg.params
        params.num_frames = self.runner.snap_frames(params.num_frames)
        self.runner.check(params)
        params.lora = self.admin.resolve(params.lora)
        output_names(msg.output_stem, msg.output_format, len(params.seeds))  # validates
        position = self._enqueue(msg.request_id, params, MediaJob(msg=msg, reply=reply))
        reply(GenerationAccepted(request_id=msg.request_id, num_frames=params.num_frames,
                                 width=params.width, height=params.height, queue_position=position))

    def _enqueue(self, request_id: str, params: Any, job: MediaJob) -> int:
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
        elif request.status == RequestStatus.RUNNING:
            self._drop_from_batch(request)
        else:
            return
        request.transition(RequestStatus.CANCELLED)
        self._finish(request)
        request.payload.reply(GenerationCancelled(request_id=request_id))

    def _drop_from_batch(self, request: ScheduledRequest) -> None:
        for batch in self.running:
            if request in batch.requests:
                batch.drop(request)
                if not batch.requests:
                    self.running.remove(batch)
                return

    def has_work(self) -> bool:
        if self.admin.paused:
            return False  # running batches hold at this step boundary until continue
        return bool(self.running or len(self.scheduler) or self.action_queue
                    or self.admin.pending)

    def step(self) -> None:
        if self.admin.paused or self.admin.apply_due():
            return
        scheduled = self._schedule()
        if scheduled is None:
            time.sleep(min(MAX_WAIT_SLEEP_S, self.scheduler.wait_s()))
            return
        try:
            output = self._execute(scheduled)
        except Exception as exc:
            self._failed(scheduled, exc)
            return
        self._update(scheduled, output)

    def stats(self) -> dict[str, Any]:
        return {"queue_depth": len(self.scheduler) + len(self.action_queue),
                "running": self.num_running(),
                "extra": {"finished": self.num_finished, "warmup_done": self.warmup.done,
                          "running_batches": len(self.running), "paused": self.admin.paused,
                          "memory": "released" if self.admin.released else "resident"}}

    def shutdown(self) -> None:
        for request in list(self.by_id.values()):
            if request.payload.msg is not None:
                request.payload.reply(ErrorReply(request_id=request.request_id,
                                                 code="stage_unavailable",
                                                 message="the generation stage is shutting down"))
        self.by_id.clear()

    # ------------------------------------------------------------------ schedule

    def _schedule(self) -> SchedulerOutput | None:
        """Actions first; then a new batch while there is room; else the next running batch."""
        if self.action_queue:
            return SchedulerOutput(action=self.action_queue.pop(0))
        batch = self._admit() or self._next_running()
        if batch is None:
            return None
        return SchedulerOutput(batch=batch, phase=batch.phase())

    def num_running(self) -> int:
        return sum(len(batch.requests) for batch in self.running)

    def _admit(self) -> RunningBatch | None:
        room = self.config.max_running_requests - self.num_running()
        if room <= 0 or self.admin.blocks_admission():
            return None  # full, or an admin operation waits for the running batches to finish
        if self.running and self.state() == "warming":
            return None  # a blocking warmup runs alone: requests queue behind it
        requests = self.scheduler.schedule(max_requests=room)
        if requests is None:
            return None
        batch = RunningBatch(requests)
        self.running.append(batch)
        return batch

    def _next_running(self) -> RunningBatch | None:
        if not self.running:
            return None
        self._turn %= len(self.running)
        batch = self.running[self._turn]
        self._turn += 1
        return batch

    # ------------------------------------------------------------------ execute

    def _execute(self, scheduled: SchedulerOutput) -> RunnerOutput:
        """Run the one scheduled unit on the runner (or the action head)."""
        if scheduled.action is not None:
            assert self.actions is not None  # submit() refuses action requests without a head
            return RunnerOutput(actions=self.actions.run(scheduled.action[0]))
        batch = scheduled.batch
        assert batch is not None
        if scheduled.phase in (Phase.PREPARE, Phase.DENOISE):
            self.admin.activate(batch.requests[0].params.lora)  # rows share one selection
        if scheduled.phase is Phase.PREPARE:
            batch.state = self.runner.prepare(*self._rows(batch))
        elif scheduled.phase is Phase.DENOISE:
            self.runner.denoise_step(batch.state)
        elif scheduled.phase is Phase.DECODE:
            row = batch.next_row
            return RunnerOutput(frames=to_uint8(self.runner.decode(batch.state, row)),
                                extras=self.runner.extras(batch.state, row))
        else:
            return RunnerOutput(file_names=self._write(batch, batch.requests[0]))
        return RunnerOutput()

    def _rows(self, batch: RunningBatch) -> tuple[list[str], list[Any], list[int]]:
        """(row owners, row params, row seeds) of a batch about to start."""
        now = time.perf_counter()
        owners, rows, seeds = [], [], []
        for request in batch.requests:
            request.payload.started_s = now
            for seed in request.params.seeds:
                owners.append(request.request_id)
                rows.append(request.params)
                seeds.append(seed)
        return owners, rows, seeds

    def _write(self, batch: RunningBatch, request: ScheduledRequest) -> list[str]:
        """Write one finished request's files (none for warmup requests)."""
        msg = request.payload.msg
        if msg is None:
            return []
        self._report([request], 99, "writing")  # before the (possibly slow) encode
        rows = batch.rows_of(request.request_id)
        names = output_names(msg.output_stem, msg.output_format, len(rows))
        for name, row in zip(names, rows):
            extras = batch.extras.get(row)
            write_output(self.output_dir, name, batch.decoded[row], msg.output_format, msg.fps,
                         msg.compression, audio=extras.audio if extras else None,
                         sample_rate=extras.sample_rate if extras else None)
        return names

    # ------------------------------------------------------------------ update

    def _update(self, scheduled: SchedulerOutput, output: RunnerOutput) -> None:
        if scheduled.action is not None:
            scheduled.action[1](output.actions)
            return
        batch = scheduled.batch
        assert batch is not None and batch.state is not None
        if scheduled.phase is Phase.PREPARE:
            self._report(batch.requests, 1, "denoising")
        elif scheduled.phase is Phase.DENOISE:
            self._report_steps(batch)
        elif scheduled.phase is Phase.DECODE:
            batch.decoded[batch.next_row] = output.frames
            batch.extras[batch.next_row] = output.extras
            batch.next_row += 1
            if batch.next_row == len(batch.state.row_owner):
                self._report(batch.requests, 95, "decoded")
        else:
            self._finish_one(batch, output.file_names)

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

    def _finish_one(self, batch: RunningBatch, names: list[str]) -> None:
        """Send the first request's result (its files are written) and drop it from the batch."""
        request = batch.requests[0]
        job: MediaJob = request.payload
        rows = batch.rows_of(request.request_id)
        frames = batch.decoded[rows[0]]
        actions = [action_output(batch.extras.get(row)) for row in rows]
        request.transition(RequestStatus.FINISHED)
        self._drop_from_batch(request)
        self._finish(request)
        job.reply(GenerationResult(
            request_id=request.request_id, file_names=names, width=int(frames.shape[2]),
            height=int(frames.shape[1]), num_frames=int(frames.shape[0]),
            inference_time_s=time.perf_counter() - job.started_s, peak_memory_mb=_peak_memory_mb(),
            actions=[a for a in actions if a is not None]))

    def _finish(self, request: ScheduledRequest) -> None:
        self.by_id.pop(request.request_id, None)
        self.num_finished += 1

    # ------------------------------------------------------------------ failures

    def _failed(self, scheduled: SchedulerOutput, exc: Exception) -> None:
        if scheduled.action is not None:
            msg, reply = scheduled.action
            log.warning("action request %s failed: %s", msg.request_id, exc)
            error = _as_error(exc)
            reply(ErrorReply(request_id=msg.request_id, code=error.code, message=error.message))
            return
        assert scheduled.batch is not None
        self._batch_failed(scheduled.batch, exc)

    def _batch_failed(self, batch: RunningBatch, exc: Exception) -> None:
        if batch in self.running:
            self.running.remove(batch)
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

    def _on_warmup(self, reply: Any) -> None:
        self.warmup.on_reply(reply)


def _rows_per_batch(config: GenerationStageConfig, runner: GenerationRunner) -> int:
    """Rows of one batch: the stage's max_batch_size, capped by what one forward can hold."""
    if runner.max_batch_size is None:
        return config.max_batch_size
    return max(1, min(config.max_batch_size, runner.max_batch_size))


def _load_actions(path: Path) -> ActionRunner | None:
    head_dir = path / ACTION_HEAD_DIR
    if not (head_dir / "config.json").is_file():
        return None
    return registry.load_runner("actions", head_dir)


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
    enhancer = load_enhancer_config(config.prompt_enhancer)
    if enhancer.base_url == "reasoner" and not server_config.stages.reasoner.enabled:
        raise ValueError("prompt_enhancer uses base_url 'reasoner' but the reasoner stage is "
                         "disabled")
