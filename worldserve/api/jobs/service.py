"""MediaService: runs image requests and video jobs on the generation stage.

Each public method is what one route calls, with one validated `MediaRequest` (read in one pass
by api/jobs/inputs.py against `request_context()`): it optionally rewrites the prompt, relays to
the stage and keeps the job record (through `JobLedger`, api/jobs/ledger.py). A video job's
relay task owns the live record in memory (`live`; reads of a live job see it) and the record
store keeps the durable copy: every status change is written, progress at most once a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import msgspec

from worldserve.api.jobs.enhancer import PromptEnhancer, maybe_enhance
from worldserve.api.jobs.figures import QueueFigures, queue_wait_histogram
from worldserve.api.jobs.idempotency import IdempotencyKey, IdempotencyKeys
from worldserve.api.jobs.inputs import RequestContext
from worldserve.api.jobs.ledger import JobLedger
from worldserve.api.jobs.params import MediaRequest
from worldserve.api.jobs.records import JobRecord, JobStatus
from worldserve.api.model_names import served_model
from worldserve.api.retry_after import SlotClock
from worldserve.api.runtime import ServerRuntime
from worldserve.api.schemas.actions import ActionEnvelope
from worldserve.errors import (
    CapacityExceeded,
    InternalError,
    NotFound,
    RequestTimeout,
    StageUnavailable,
    StorageFull,
    WorldserveError,
)
from worldserve.ipc.capabilities import (
    GenerationCapabilities,
    capabilities_as,
)
from worldserve.ipc.client import StageClient, new_request_id
from worldserve.ipc.messages import (
    ActionsResult,
    Cancel,
    GenerateActions,
    GenerateMedia,
    GenerationAccepted,
    GenerationCancelled,
    GenerationParams,
    GenerationProgress,
    GenerationResult,
    LoraRef,
)
from worldserve.media.policy import MediaPolicy

log = logging.getLogger("worldserve.jobs")
NO_FILE = "none"  # output_format of a data-only request (the stage writes no file)

STAGE = "generation"
ACCEPT_TIMEOUT_S = 60.0
ACTION_TIMEOUT_S = 300.0
Opened = tuple[Any, Any]  # (the stage's reply stream, its iterator)


# An output index in `?variant=`: ASCII digits only (`str.isdigit` also takes '²', which
# `int()` refuses), and short (a 5,000-digit index is refused by `int()` too).
_VARIANT = re.compile(r"[0-9]{1,6}")


def variant_index(variant: str, not_found: str) -> int:
    """The output index `variant` names; NotFound(`not_found`) when it names none."""
    if not _VARIANT.fullmatch(variant):
        raise NotFound(not_found, param="variant")
    return int(variant)


class MediaService:
    def __init__(self, runtime: ServerRuntime, enhancer: PromptEnhancer | None = None) -> None:
        self.runtime = runtime
        self.enhancer = enhancer
        self.config = runtime.config.stages.generation
        self.policy = MediaPolicy.from_config(runtime.config)
        self.ledger = JobLedger(
            self.config.resolved_output_dir(),
            runtime.config.output_ttl_s,
            runtime.config.max_job_records,
            id_tag=runtime.id_tag,
        )
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.live: dict[str, JobRecord] = {}  # video jobs being relayed: the records they own
        self.in_flight = 0
        self.slots = SlotClock()  # how long admission slots are held: the 503's Retry-After
        self.keys = IdempotencyKeys(self.ledger.store)
        # SGLang's /v1/set_lora (routes/sglang.py): adapters for requests that name none
        self.active_lora: list[LoraRef] = []
        self.ledger.recover()
        registry = runtime.metrics.registry
        self.queue_wait = queue_wait_histogram(registry)
        registry.register(QueueFigures(self.ledger))

    # ------------------------------------------------------------------ stage facts

    def client(self) -> StageClient:
        return self.runtime.client(STAGE)

    def capabilities(self) -> GenerationCapabilities:
        info = self.client().info
        return capabilities_as(info.capabilities if info else None, GenerationCapabilities)

    def request_context(self) -> RequestContext:
        """What a request is read and validated against (api/jobs/inputs.py)."""
        return RequestContext(self.policy, self.runtime.config.max_upload_bytes,
                              self.capabilities())

    def model_name(self) -> str:
        info = self.client().info
        return info.model if info else STAGE

    def served_model(self, requested: str | None) -> str:
        """The served model a request names (omitted: the one served); any other name gets
        the answer every route gives for an unknown model (404)."""
        if requested is None:
            return self.model_name()
        return served_model(self.runtime, requested, (STAGE,))["id"]

    @contextlib.contextmanager
    def admit(self, measured: bool = True) -> Iterator[None]:
        """Admission over every native media request in flight (spec §1.4, 503 Retry-After).
        `measured=False`: a video's create phase, whose slot the job then holds (measured)."""
        if self.in_flight >= self.config.max_in_flight:
            raise CapacityExceeded(
                f"too many generation requests in flight "
                f"(max_in_flight={self.config.max_in_flight}); retry shortly",
                retry_after_s=self.slots.retry_after_s(),
            )
        self.in_flight += 1
        slot = self.slots.hold()
        try:
            yield
        finally:
            self.in_flight -= 1
            self.slots.release(slot, measured)

    # ------------------------------------------------------------------ relaying

    def _with_active_lora(self, params: GenerationParams) -> GenerationParams:
        if params.lora or not self.active_lora:
            return params
        return msgspec.structs.replace(params, lora=list(self.active_lora))

    def _message(self, record_id: str, request: MediaRequest) -> GenerateMedia:
        return GenerateMedia(
            request_id=new_request_id("gen"),
            params=self._with_active_lora(request.params),
            output_stem=record_id,
            output_format=request.output_format,
            fps=request.fps,
            compression=request.compression,
        )

    async def _open(self, msg: GenerateMedia) -> tuple[Opened, GenerationAccepted]:
        """Send the request and wait for the stage's acceptance (validation by the model)."""
        stream = await self.client().stream(msg, max_queued=8)
        iterator = stream.__aiter__()
        try:
            first = await asyncio.wait_for(iterator.__anext__(), ACCEPT_TIMEOUT_S)
        except asyncio.TimeoutError:
            stream.cancel()
            raise RequestTimeout(
                "the generation stage did not accept the request in time"
            ) from None
        except BaseException:
            stream.cancel()
            raise
        if not isinstance(first, GenerationAccepted):
            stream.cancel()
            raise InternalError(f"unexpected first reply {type(first).__name__}")
        return (stream, iterator), first

    async def _replies(self, opened: Opened) -> AsyncIterator[Any]:
        _, iterator = opened
        deadline = self.config.request_timeout_s
        while True:
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
                # that races with a reply, and a cancelled job (shutdown) would never end.
                async with asyncio.timeout(deadline):
                    reply = await iterator.__anext__()
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise RequestTimeout(
                    f"generation did not finish within {deadline:g} s (request_timeout_s)"
                ) from None
            yield reply

    def _progress(self, record: JobRecord, update: GenerationProgress) -> None:
        waited_s = self.ledger.progress(record, update)
        if waited_s is not None:  # the engine admitted the job just now
            self.queue_wait.labels(record.kind).observe(waited_s)

    async def _enhance(self, request: MediaRequest) -> None:
        if request.enhance_prompt:
            params = request.params
            params.prompt = await maybe_enhance(self.enhancer, True, params.prompt)

    # ------------------------------------------------------------------ images

    async def generate_images(self, request: MediaRequest,
                              key: IdempotencyKey | None = None) -> JobRecord:
        """Run a synchronous image request; returns its completed record (with an
        Idempotency-Key already used for this request: the record it made)."""
        return await self.keys.once(key, lambda: self._generate_images(request),
                                   self.get_image)

    def get_image(self, image_id: str) -> JobRecord:
        record = self.ledger.get(image_id, "image")
        if record is None:
            raise self.ledger.missing(image_id, "image", "Image not found")
        return record

    async def _generate_images(self, request: MediaRequest) -> JobRecord:
        request.model = self.served_model(request.model)
        await self._enhance(request)
        with self.admit():
            return await self._run_images(request)

    async def _run_images(self, request: MediaRequest) -> JobRecord:
        record = self.ledger.new(
            "image",
            request,
            num_input_images=len(request.params.condition_images),
            response_format=request.response_format,
        )
        self.ledger.insert(record)
        opened = None
        try:
            opened, _ = await self._open(self._message(record.id, request))
            async for reply in self._replies(opened):
                if isinstance(reply, GenerationProgress):
                    self._progress(record, reply)
                elif isinstance(reply, GenerationResult):
                    self.ledger.complete(record, reply)
        except WorldserveError as exc:
            self.ledger.fail(record, exc)
            raise
        except asyncio.CancelledError:  # the client went away: stop the work
            self.ledger.cancel(record, "request cancelled")
            raise
        finally:
            if opened is not None:
                opened[0].cancel()
        if record.status != JobStatus.COMPLETED:
            raise InternalError("the generation stage ended the request without a result")
        return record

    # ------------------------------------------------------------------ actions

    async def generate_actions(self, env: ActionEnvelope, images: list[bytes]) -> ActionsResult:
        params = env.parameters
        msg = GenerateActions(
            request_id=new_request_id("act"),
            task=env.task,
            images=images,
            state=env.state.tobytes() if env.state is not None else b"",
            noise=env.noise.tobytes() if env.noise is not None else b"",
            num_inference_steps=params.num_inference_steps,
            action_horizon=params.action_horizon,
            seed=params.seed if params.seed is not None else 42,
            num_candidates=params.candidate_count or 1,
            lora=env.lora or list(self.active_lora),
        )
        with self.admit():
            result = await self.client().call(msg, timeout_s=ACTION_TIMEOUT_S)
        if not isinstance(result, ActionsResult):
            raise InternalError(f"unexpected reply {type(result).__name__} to an action request")
        return result

    async def generate_data(self, params: GenerationParams) -> GenerationResult:
        """A data-only generation (world-model actions): no file, the result carries the data.
        Interleaves with media requests like any other; a client that goes away cancels it."""
        msg = GenerateMedia(request_id=new_request_id("act"), params=self._with_active_lora(params),
                            output_stem="actions", output_format=NO_FILE)
        with self.admit():
            opened, _ = await self._open(msg)
            try:
                async for reply in self._replies(opened):
                    if isinstance(reply, GenerationResult):
                        return reply
            finally:
                opened[0].cancel()
        raise InternalError("the generation stage ended the request without a result")

    # ------------------------------------------------------------------ videos

    async def create_video(self, request: MediaRequest,
                           key: IdempotencyKey | None = None) -> JobRecord:
        """Queue a video job; returns its record once the stage accepted it (with an
        Idempotency-Key already used for this request: the job it created)."""
        return await self.keys.once(key, lambda: self._create_video(request), self.get_video)

    async def _create_video(self, request: MediaRequest) -> JobRecord:
        model = self.served_model(request.model)
        await self._enhance(request)
        record = self.ledger.new("video", request, model=model, action=request.action,
                                 remixed_from_video_id=request.remixed_from_video_id)
        with self.admit(measured=False):
            msg = self._message(record.id, request)
            opened, accepted = await self._open(msg)
        record.stage_request_id = msg.request_id
        record.size = f"{accepted.width}x{accepted.height}"
        record.num_frames = accepted.num_frames
        record.queue_position = accepted.queue_position
        record.seconds = str(round(accepted.num_frames / max(1, request.fps)))
        try:
            self.ledger.insert(record)
        except StorageFull:  # no record, no job: the stage stops the work it accepted
            opened[0].cancel()
            raise
        self.live[record.id] = record
        self.in_flight += 1  # a live job holds an admission slot until it ends
        self.tasks[record.id] = asyncio.get_running_loop().create_task(
            self._run_video(record, opened, self.slots.hold())
        )
        return record

    async def _run_video(self, record: JobRecord, opened: Opened, slot: int) -> None:
        try:
            async for reply in self._replies(opened):
                if self.live.get(record.id) is not record:
                    break  # deleted: nothing is left to update
                if isinstance(reply, GenerationProgress):
                    self._progress(record, reply)
                elif isinstance(reply, GenerationResult):
                    self.ledger.complete(record, reply)
                elif isinstance(reply, GenerationCancelled):
                    self.ledger.cancel(record, "job cancelled")
        except WorldserveError as exc:
            self.ledger.fail(record, exc)
        except Exception as exc:  # the relay must always leave the job terminal
            log.exception("video job %s relay failed", record.id)
            self.ledger.fail(record, InternalError(f"the job relay failed ({type(exc).__name__})"))
        finally:
            opened[0].cancel()
            self.in_flight -= 1
            self.slots.release(slot)
            self.tasks.pop(record.id, None)
            if self.live.get(record.id) is record:
                del self.live[record.id]

    def get_video(self, video_id: str) -> JobRecord:
        """The live record of a job being relayed, else the stored one."""
        record = self.live.get(video_id) or self.ledger.get(video_id, "video")
        if record is None:
            raise self.ledger.missing(video_id, "video", "Video not found")
        return record

    def list_videos(
        self, after: str | None, limit: int, descending: bool
    ) -> tuple[list[JobRecord], bool]:
        records, has_more = self.ledger.page("video", after, limit, descending)
        return [self.live.get(record.id, record) for record in records], has_more

    async def delete_video(self, video_id: str) -> JobRecord:
        record = self.get_video(video_id)
        if record.status.is_live:
            self.ledger.cancel(record, "job deleted")
            self._cancel_on_stage(record)
            task = self.tasks.get(video_id)
            if task is not None:
                done, _ = await asyncio.wait({task}, timeout=self.config.video_cancel_timeout_s)
                if not done:
                    log.warning(
                        "stage did not confirm cancelling %s in time; removing it", video_id
                    )
        self.live.pop(video_id, None)
        self.ledger.remove(record)
        return record

    def cancel_video(self, record: JobRecord, reason: str) -> None:
        """Stop a live job that nobody waits for any more (a synchronous client went away):
        it becomes `cancelled` and the stage is told; the record stays."""
        if record.status.is_live:
            self.ledger.cancel(record, reason)
            self._cancel_on_stage(record)

    def _cancel_on_stage(self, record: JobRecord) -> None:
        with contextlib.suppress(StageUnavailable):
            self.client().send_nowait(
                Cancel(request_id=new_request_id("cancel"), target_id=record.stage_request_id or "")
            )

    # ------------------------------------------------------------------ files

    def paths(self, record: JobRecord) -> list[Path]:
        return self.ledger.paths(record)

    def video_file(self, video_id: str, variant: str | None) -> Path:
        """The file of a finished video job (`variant`: None, "video" or an output index)."""
        record = self.get_video(video_id)
        index = 0
        if variant is not None and variant != "video":
            index = variant_index(variant, f"Variant {variant[:64]} not available")
        if record.status in (JobStatus.FAILED, JobStatus.CANCELLED):
            raise NotFound(f"Video generation {record.status.value}")
        paths = self.paths(record)
        if record.status != JobStatus.COMPLETED or not paths:
            raise NotFound("Generation is still in-progress")
        if index >= len(paths):
            raise NotFound(f"Variant {variant} not available", param="variant")
        if not paths[index].is_file():
            raise NotFound("Video file is missing from the output directory")
        return paths[index]

    def image_file(self, image_id: str, variant: str | None) -> Path:
        """The file of output `variant` (default 0) of an image request."""
        record = self.get_image(image_id)
        paths = self.paths(record)
        index = 0
        if variant is not None:
            index = variant_index(variant, f"Image variant {variant[:64]} not found")
            if index >= max(1, len(paths)):
                raise NotFound(f"Image variant {variant} not found", param="variant")
        if record.status in (JobStatus.FAILED, JobStatus.CANCELLED):
            raise NotFound(f"Image generation {record.status.value}")
        if index >= len(paths) or not paths[index].is_file():
            raise NotFound("Image is still being generated")
        return paths[index]

    # ------------------------------------------------------------------ lifecycle

    def prune(self) -> dict[str, Any]:
        return self.ledger.prune()

    def start_sweeper(self) -> None:
        self.ledger.start_sweeper()

    async def shutdown(self) -> None:
        """Orderly shutdown: live jobs become `cancelled` after the stage was asked to stop them."""
        self.ledger.stop_sweeper()
        for video_id, task in list(self.tasks.items()):
            record = self.live.get(video_id)
            if record is not None and record.status.is_live:
                self._cancel_on_stage(record)
                self.ledger.cancel(record, "server shut down before the job finished")
            task.cancel()
        await asyncio.sleep(0.05)  # let the cancellations reach the stage before it stops
