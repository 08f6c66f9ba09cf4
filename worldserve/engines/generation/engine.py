"""Generation stage engine: each `step()` is `schedule -> execute -> update`.

`schedule` (the `Scheduler`, which owns every queue and the pause state) picks one unit: an
action request, a new batch to start (when fewer than `max_running_requests` requests run), or
the next phase of a running batch, round-robin over the running batches. `execute` runs that
one runner phase (prepare, one denoising step, one row's decode, or writing one request's
files); `update` turns its output into replies. Several batches run at once, each advanced one
phase per turn, so a short request is not stuck behind a long one; cancellation applies at the
next step boundary; a request that fails inside a batch is retried alone and then fails alone.

Past ~400 lines on purpose: the loop's three steps and the reply of each phase read best in one
file (nano-vllm's `llm_engine.py` shape); startup levers are in levers.py, outputs in outputs.py.
"""

from __future__ import annotations

import logging
import resource
import time
from typing import Any, Callable

from worldserve.config import GenerationStageConfig, ServerConfig
from worldserve.engines.common import model_dir, model_profile, served_model_name
from worldserve.engines.generation.admin import GenerationAdmin, ServedModel
from worldserve.engines.generation.batch import (
    MediaJob,
    Phase,
    RequestStatus,
    RunnerOutput,
    RunningBatch,
    ScheduledRequest,
    SchedulerOutput,
)
from worldserve.engines.generation.contract import (
    ActionRunner,
    ChunkedDecodeRunner,
    GenerationRunner,
    StepCacheRunner,
    YieldingRunner,
)
from worldserve.engines.generation.levers import (
    configure_speed,
    configure_vae,
    enable_step_cache,
    step_cache_report,
)
from worldserve.engines.generation.outputs import (
    action_output,
    output_names,
    remove_outputs,
    to_uint8,
    write_error,
    write_output,
)
from worldserve.engines.generation.progress import (
    QUEUE_POSITION,
    report,
    report_admitted,
    report_queue,
)
from worldserve.engines.generation.scheduler import Scheduler, denoise_progress
from worldserve.engines.generation.warmup import WarmupPlan
from worldserve.enhancer_config import load_enhancer_config
from worldserve.errors import InternalError, InvalidRequest, WorldserveError
from worldserve.ipc.capabilities import (
    ActionHeadCapabilities,
    GenerationCapabilities,
)
from worldserve.ipc.messages import (
    AdminRequest,
    ErrorReply,
    GenerateActions,
    GenerateMedia,
    GenerationAccepted,
    GenerationCancelled,
    GenerationResult,
    Request,
)
from worldserve.models import registry
from worldserve.models.types import feature_capabilities
from worldserve.runtime.devices import resolve_in_process
from worldserve.runtime.engine import EngineState, ReplyFn

log = logging.getLogger("worldserve.generation")

MAX_WAIT_SLEEP_S = 0.002


class GenerationEngine:
    def __init__(self, stage_config: GenerationStageConfig, server_config: ServerConfig,
                 runner: GenerationRunner | None = None) -> None:
        stage_config = resolve_in_process(stage_config)  # `auto` device/dtype, built by hand
        path = model_dir(stage_config)
        self.config = stage_config
        _check_prompt_enhancer(stage_config, server_config)
        self.output_dir = stage_config.resolved_output_dir()
        self.output_dir.mkdir(parents=True, exist_ok=True)
        if runner is None:
            registry.check_attention_backend("generation", path, stage_config.attention_backend)
        self.runner: GenerationRunner = runner or registry.load_runner(
            "generation", path, dtype=stage_config.dtype, device=stage_config.device,
            safety_checker=stage_config.safety_checker, **stage_config.quant_options())
        if runner is None:  # an injected runner comes configured
            configure_speed(self.runner, stage_config)
        self.pipe = self.runner.pipe
        self.step_cache = enable_step_cache(stage_config, self.runner)
        self.actions: ActionRunner | None = registry.load_actions(path)
        self.defaults = self.runner.features.defaults  # the family's, for this checkpoint
        self.model_name = served_model_name(stage_config, path)
        self.model_path = str(path)
        self.profile = model_profile("generation", path, stage_config.dtype)
        self.num_params = self.runner.num_params
        self.scheduler = Scheduler(_rows_per_batch(stage_config, self.runner),
                                   stage_config.batch_wait_ms / 1000,
                                   stage_config.max_running_requests)
        self.num_finished = 0
        self.denoise_steps = 0  # batched denoising steps run, and the rows they advanced:
        self.denoise_rows = 0  # rows / steps is how well batching works (stats, benchmarks)
        self.vae = configure_vae(self.runner, stage_config)
        self.admin = GenerationAdmin(self.runner, self.scheduler, self._served())
        self.warmup = WarmupPlan.create(stage_config, self.defaults, self.runner)
        for params in self.warmup.requests():
            self._enqueue(f"warmup-{len(self.scheduler.requests)}", params,
                          MediaJob(msg=None, reply=self._on_warmup))

    def _served(self) -> ServedModel:
        return ServedModel(
            name=self.model_name, path=self.model_path, dtype=self.config.dtype,
            device=self.config.device, num_params=self.num_params,
            action_head=self.actions.metadata() if self.actions is not None else None,
            vae=self.vae)

    # ------------------------------------------------------------------ protocol

    def capabilities(self) -> GenerationCapabilities:
        return GenerationCapabilities(
            pipeline=type(self.pipe).__name__,
            size_multiple=self.runner.size_multiple,
            temporal_stride=self.runner.temporal_stride,
            max_batch_size=self.config.max_batch_size,
            image_conditioning=True,
            max_input_images=4,
            output_dir=str(self.output_dir),
            actions=ActionHeadCapabilities(**self.actions.metadata()) if self.actions else None,
            variant=self.profile.variant, precision=self.profile.precision,
            model_modes=self.profile.model_modes,
            step_cache=self.step_cache,
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
        self.scheduler.add_action((msg, reply))

    def _submit_media(self, msg: GenerateMedia, reply: ReplyFn) -> None:
        self.admin.check_servable()
        params = msg.params
        params.num_frames = self.runner.snap_frames(params.num_frames)
        if params.step_cache is None:  # the request left it to the server
            params.step_cache = self.step_cache is not None and self.config.step_cache.default
        self.runner.check(params)
        params.lora = self.admin.resolve(params.lora)
        output_names(msg.output_stem, msg.output_format, len(params.seeds))  # validates
        position = self._enqueue(msg.request_id, params, MediaJob(msg=msg, reply=reply))
        self.scheduler.requests[msg.request_id].extra[QUEUE_POSITION] = position
        reply(GenerationAccepted(request_id=msg.request_id, num_frames=params.num_frames,
                                 width=params.width, height=params.height, queue_position=position))

    def _enqueue(self, request_id: str, params: Any, job: MediaJob) -> int:
        request = ScheduledRequest(request_id=request_id, params=params,
                                   arrival_s=self.scheduler.clock(), payload=job)
        return self.scheduler.add(request)

    def cancel(self, request_id: str) -> None:
        request = self.scheduler.abort(request_id)
        if request is not None:
            self.num_finished += 1
            request.payload.reply(GenerationCancelled(request_id=request_id))
            report_queue(self.scheduler.waiting)  # the requests behind it moved up

    def has_work(self) -> bool:
        if self.scheduler.paused:
            return False  # running batches hold at this step boundary until continue
        return self.scheduler.has_work() or bool(self.admin.pending)

    def set_yield_point(self, yield_point: Callable[[], None] | None) -> int:
        """Colocated stages (runtime/colocation.py): call `yield_point()` before every
        transformer block of the coming forwards (None: take the hooks off again). The number
        of blocks hooked; 0 when the model has none to hook."""
        if not isinstance(self.runner, YieldingRunner):
            return 0
        return self.runner.set_yield_point(yield_point)

    def step(self) -> None:
        if self.scheduler.paused or self.admin.apply_due():
            return
        # A blocking warmup runs alone: requests queue behind it.
        warming_alone = self.state() == "warming" and bool(self.scheduler.running)
        scheduled = self.scheduler.schedule(admit=not warming_alone)
        if scheduled is None:
            time.sleep(min(MAX_WAIT_SLEEP_S, self.scheduler.wait_s()))
            return
        if scheduled.batch is not None and scheduled.phase is Phase.PREPARE:  # admitted now
            report_admitted(scheduled.batch.requests, self.scheduler.waiting)
        started = time.perf_counter()
        try:
            output = self._execute(scheduled)
        except Exception as exc:
            self._failed(scheduled, exc)
            return
        if scheduled.batch is not None and scheduled.phase is not None:
            scheduled.batch.account(scheduled.phase, time.perf_counter() - started)
        self._update(scheduled, output)

    @property
    def running(self) -> list[RunningBatch]:
        """The running batches (the scheduler's; read them, never change them)."""
        return self.scheduler.running

    def num_running(self) -> int:
        return self.scheduler.num_running()

    def stats(self) -> dict[str, Any]:
        scheduler = self.scheduler
        return {"queue_depth": len(scheduler) + len(scheduler.actions),
                "running": scheduler.num_running(),
                "extra": {"finished": self.num_finished, "warmup_done": self.warmup.done,
                          "running_batches": len(scheduler.running), "paused": scheduler.paused,
                          "denoise_steps": self.denoise_steps, "denoise_rows": self.denoise_rows,
                          "memory": "released" if self.admin.released else "resident"}}

    def shutdown(self) -> None:
        for request in self.scheduler.drop_all():
            if request.payload.msg is not None:
                request.payload.reply(ErrorReply(request_id=request.request_id,
                                                 code="stage_unavailable",
                                                 message="the generation stage is shutting down"))

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
            if isinstance(self.runner, StepCacheRunner):
                batch.cache_stats[row] = self.runner.step_cache_stats(batch.state, row)
            frames = self._decode(batch.state, row)
            if frames is None:  # a chunked decode with frames left: the row stays next
                return RunnerOutput()
            return RunnerOutput(frames=to_uint8(frames),
                                extras=self.runner.extras(batch.state, row))
        else:
            return RunnerOutput(file_names=self._write(batch, batch.requests[0]))
        return RunnerOutput()

    def _decode(self, state: Any, row: int) -> Any:
        """One row's frames, or None while a chunked decode (vae_decode_chunk_frames) of it
        has latent frames left; each call is one engine step."""
        chunk = self.config.vae_decode_chunk_frames
        if chunk and isinstance(self.runner, ChunkedDecodeRunner):
            return self.runner.decode_chunk(state, row, chunk)
        return self.runner.decode(state, row)

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
        steps = batch.state.num_steps if batch.state is not None else 0
        report([request], 99, "mux", steps, steps)  # before the (possibly slow) encode
        rows = batch.rows_of(request.request_id)
        names = output_names(msg.output_stem, msg.output_format, len(rows))
        written: list[str] = []
        try:
            for name, row in zip(names, rows):
                extras = batch.extras.get(row)
                write_output(self.output_dir, name, batch.decoded[row], msg.output_format,
                             msg.fps, msg.compression, audio=extras.audio if extras else None,
                             sample_rate=extras.sample_rate if extras else None)
                written.append(name)
        except OSError as exc:  # a full disk: the request fails, none of its files remains
            remove_outputs(self.output_dir, written)
            raise write_error(names[len(written)], exc) from None
        return names

    # ------------------------------------------------------------------ update

    def _update(self, scheduled: SchedulerOutput, output: RunnerOutput) -> None:
        if scheduled.action is not None:
            scheduled.action[1](output.actions)
            return
        batch = scheduled.batch
        assert batch is not None and batch.state is not None
        if scheduled.phase is Phase.PREPARE:
            report(batch.requests, 1, "denoise", 0, batch.state.num_steps)
        elif scheduled.phase is Phase.DENOISE:
            self._report_steps(batch)
        elif scheduled.phase is Phase.DECODE:
            if output.frames is None:
                return
            batch.decoded[batch.next_row] = output.frames
            batch.extras[batch.next_row] = output.extras
            batch.next_row += 1
            if batch.next_row == len(batch.state.row_owner):
                steps = batch.state.num_steps
                report(batch.requests, 95, "mux", steps, steps)
        else:
            self._finish_one(batch, output.file_names)

    def _report_steps(self, batch: RunningBatch) -> None:
        state = batch.state
        assert state is not None
        progress = denoise_progress(state.step_index, state.num_steps)
        self.denoise_steps += 1
        self.denoise_rows += len(state.row_owner)
        for request in batch.requests:
            request.steps_done = state.step_index
        phase = "decode" if state.done_denoising else "denoise"
        report(batch.requests, progress, phase, state.step_index, state.num_steps)

    def _finish_one(self, batch: RunningBatch, names: list[str]) -> None:
        """Send the first request's result (its files are written) and drop it from the batch."""
        request = batch.requests[0]
        job: MediaJob = request.payload
        rows = batch.rows_of(request.request_id)
        frames = batch.decoded[rows[0]]
        actions = [action_output(batch.extras.get(row)) for row in rows]
        self.scheduler.finish(request, RequestStatus.FINISHED)
        self.num_finished += 1
        job.reply(GenerationResult(
            request_id=request.request_id, file_names=names, width=int(frames.shape[2]),
            height=int(frames.shape[1]), num_frames=int(frames.shape[0]),
            inference_time_s=time.perf_counter() - job.started_s, peak_memory_mb=_peak_memory_mb(),
            stage_durations={k: round(v, 6) for k, v in job.durations.items()},
            actions=[a for a in actions if a is not None],
            step_cache=step_cache_report([batch.cache_stats.get(row) for row in rows])))

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
        failed = self.scheduler.batch_failed(batch)
        if not failed:
            log.warning("a batch of %d requests failed (%s); retrying each alone",
                        len(batch.requests), exc)
        for request in failed:
            log.warning("request %s failed: %s", request.request_id, exc)
            self.num_finished += 1
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


def _as_error(exc: Exception) -> WorldserveError:
    if isinstance(exc, WorldserveError):
        return exc
    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, (ValueError, TypeError)):
        return InvalidRequest(first_line)
    return InternalError(first_line)


def _peak_memory_mb() -> float:
    """The device's peak allocated memory (CUDA), else the stage process's peak RSS; 0.0 when
    neither can be read (clients compare it with `> 0`)."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.max_memory_allocated() / 2**20
    except Exception:  # memory figures are optional; never fail a request for them
        return 0.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _check_prompt_enhancer(config: GenerationStageConfig, server_config: ServerConfig) -> None:
    """The routes cannot start with a broken enhancer file: the stage fails to start (spec §1.3)."""
    if config.prompt_enhancer is None:
        return
    enhancer = load_enhancer_config(config.prompt_enhancer)
    if enhancer.base_url == "reasoner" and not server_config.stages.reasoner.enabled:
        raise ValueError("prompt_enhancer uses base_url 'reasoner' but the reasoner stage is "
                         "disabled")
