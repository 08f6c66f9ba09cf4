"""MediaService: runs image requests and video jobs on the generation stage, owns their records.

Video job state machine (spec §4.3): queued -> in_progress -> completed | failed | cancelled;
terminal states never change. A job's relay task consumes the stage's reply stream and writes
every state change to the record store. Retention (spec §9): restart recovery, TTL and
max-records pruning, a sweeper every 60 s, and file deletion with the record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from pathlib import Path
from typing import Any, AsyncIterator

from worldserve.api.jobs.enhancer import PromptEnhancer
from worldserve.api.jobs.params import ResolvedRequest
from worldserve.api.jobs.store import LIVE_STATUSES, RecordStore
from worldserve.api.runtime import ServerRuntime
from worldserve.errors import (
    CapacityExceeded,
    InternalError,
    NotFound,
    RequestTimeout,
    StageUnavailable,
    WorldserveError,
)
from worldserve.ipc.capabilities import GenerationCapabilities, capabilities_as
from worldserve.ipc.client import StageClient, new_request_id
from worldserve.ipc.messages import (
    Cancel,
    GenerateMedia,
    GenerationAccepted,
    GenerationCancelled,
    GenerationProgress,
    GenerationResult,
)
from worldserve.media.policy import MediaPolicy

log = logging.getLogger("worldserve.jobs")

STAGE = "generation"
SWEEP_INTERVAL_S = 60.0
ACCEPT_TIMEOUT_S = 60.0
RECORDS_FILE = Path(".worldserve") / "records.sqlite3"
_ERROR_CODES = {"invalid_request": "invalid_request", "stage_unavailable": "stage_unavailable",
                "timeout": "timeout"}
TRANSITIONS = {"queued": {"in_progress", "completed", "failed", "cancelled"},
               "in_progress": {"completed", "failed", "cancelled"}}


def now_s() -> int:
    return int(time.time())


class MediaService:
    def __init__(self, runtime: ServerRuntime, enhancer: PromptEnhancer | None = None) -> None:
        self.runtime = runtime
        self.enhancer = enhancer
        cfg = runtime.config.stages.generation
        self.config = cfg
        self.output_dir = cfg.resolved_output_dir()
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.store = RecordStore(self.output_dir / RECORDS_FILE)
        self.ttl_s = runtime.config.output_ttl_s
        self.max_records = runtime.config.max_job_records
        self.policy = MediaPolicy.from_config(runtime.config)
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.in_flight = 0
        self._sweeper: asyncio.Task[None] | None = None
        self.recover()

    # ------------------------------------------------------------------ stage facts

    def client(self) -> StageClient:
        return self.runtime.client(STAGE)

    def capabilities(self) -> GenerationCapabilities:
        info = self.client().info
        return capabilities_as(info.capabilities if info else None, GenerationCapabilities)

    def model_name(self) -> str:
        info = self.client().info
        return info.model if info else STAGE

    @contextlib.contextmanager
    def admit(self) -> Any:
        """Admission over every native media request in flight (spec §1.4, 503 Retry-After)."""
        if self.in_flight >= self.config.max_in_flight:
            raise CapacityExceeded(f"too many generation requests in flight "
                                   f"(max_in_flight={self.config.max_in_flight}); retry shortly")
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    # ------------------------------------------------------------------ relaying

    def _message(self, record_id: str, resolved: ResolvedRequest) -> GenerateMedia:
        return GenerateMedia(request_id=new_request_id("gen"), params=resolved.params,
                             output_stem=record_id, output_format=resolved.output_format,
                             fps=resolved.fps, compression=resolved.compression)

    async def _open(self, msg: GenerateMedia) -> tuple[Any, GenerationAccepted]:
        """Send the request and wait for the stage's acceptance (validation by the model)."""
        stream = await self.client().stream(msg, max_queued=8)
        iterator = stream.__aiter__()
        try:
            first = await asyncio.wait_for(iterator.__anext__(), ACCEPT_TIMEOUT_S)
        except asyncio.TimeoutError:
            stream.cancel()
            raise RequestTimeout("the generation stage did not accept the request in time") from None
        except BaseException:
            stream.cancel()
            raise
        if not isinstance(first, GenerationAccepted):
            stream.cancel()
            raise InternalError(f"unexpected first reply {type(first).__name__}")
        return (stream, iterator), first

    async def _replies(self, opened: tuple[Any, Any]) -> AsyncIterator[Any]:
        _, iterator = opened
        deadline = self.config.request_timeout_s
        while True:
            try:
                reply = await asyncio.wait_for(iterator.__anext__(), deadline)
            except StopAsyncIteration:
                return
            except asyncio.TimeoutError:
                raise RequestTimeout(f"generation did not finish within {deadline:g} s "
                                     "(request_timeout_s)") from None
            yield reply

    # ------------------------------------------------------------------ images

    async def generate_images(self, resolved: ResolvedRequest, extra: dict[str, Any]) -> dict[str, Any]:
        """Run a synchronous image request; returns its completed record."""
        with self.admit():
            return await self._run_images(resolved, extra)

    async def _run_images(self, resolved: ResolvedRequest, extra: dict[str, Any]) -> dict[str, Any]:
        record = self._new_record("image", resolved, extra)
        record["status"] = "in_progress"
        self.store.insert(record)
        msg = self._message(record["id"], resolved)
        opened = None
        try:
            opened, _ = await self._open(msg)
            async for reply in self._replies(opened):
                if isinstance(reply, GenerationResult):
                    self._complete(record, reply)
        except WorldserveError as exc:
            self._fail(record, exc)
            raise
        except asyncio.CancelledError:  # the client went away: stop the work
            self._set_status(record, "cancelled", error={"message": "request cancelled",
                                                         "code": "cancelled"})
            raise
        finally:
            if opened is not None:
                opened[0].cancel()
        if record["status"] != "completed":
            raise InternalError("the generation stage ended the request without a result")
        return record

    # ------------------------------------------------------------------ videos

    async def create_video(self, resolved: ResolvedRequest, extra: dict[str, Any]) -> dict[str, Any]:
        record = self._new_record("video", resolved, extra)
        with self.admit():
            msg = self._message(record["id"], resolved)
            opened, accepted = await self._open(msg)
        record["stage_request_id"] = msg.request_id
        record["size"] = f"{accepted.width}x{accepted.height}"
        record["num_frames"] = accepted.num_frames
        record["seconds"] = str(round(accepted.num_frames / max(1, resolved.fps)))
        self.store.insert(record)
        self.in_flight += 1  # a live job holds an admission slot until it ends
        self.tasks[record["id"]] = asyncio.get_running_loop().create_task(
            self._run_video(record, opened))
        return record

    async def _run_video(self, record: dict[str, Any], opened: tuple[Any, Any]) -> None:
        try:
            async for reply in self._replies(opened):
                if not self._exists(record):
                    break
                if isinstance(reply, GenerationProgress):
                    self._progress(record, reply.progress)
                elif isinstance(reply, GenerationResult):
                    self._complete(record, reply)
                elif isinstance(reply, GenerationCancelled):
                    self._set_status(record, "cancelled",
                                     error={"message": "job cancelled", "code": "cancelled"})
        except WorldserveError as exc:
            self._fail(record, exc)
        except Exception as exc:  # the relay must always leave the job terminal
            log.exception("video job %s relay failed", record["id"])
            self._fail(record, InternalError(str(exc)))
        finally:
            opened[0].cancel()
            self.in_flight -= 1
            self.tasks.pop(record["id"], None)

    def get_video(self, video_id: str) -> dict[str, Any]:
        record = self.store.get(video_id, "video")
        if record is None or _expired(record):
            raise NotFound("Video not found", param="video_id")
        return record

    def list_videos(self, after: str | None, limit: int, descending: bool) -> tuple[list, bool]:
        return self.store.page("video", after, limit, descending, now_s())

    async def delete_video(self, video_id: str) -> dict[str, Any]:
        record = self.get_video(video_id)
        if record["status"] in LIVE_STATUSES:
            self._set_status(record, "cancelled", error={"message": "job deleted", "code": "cancelled"})
            task = self.tasks.get(video_id)
            with contextlib.suppress(StageUnavailable):
                self.client().send_nowait(Cancel(request_id=new_request_id("cancel"),
                                                 target_id=record["stage_request_id"]))
            if task is not None:
                done, _ = await asyncio.wait({task}, timeout=self.config.video_cancel_timeout_s)
                if not done:
                    log.warning("stage did not confirm cancelling %s in time; removing it", video_id)
        self.remove(record)
        return record

    # ------------------------------------------------------------------ record changes

    def _new_record(self, kind: str, resolved: ResolvedRequest, extra: dict[str, Any]) -> dict:
        p = resolved.params
        record = {"id": str(uuid.uuid4()), "_kind": kind, "status": "queued", "progress": 0,
                  "created_at": now_s(), "completed_at": None, "expires_at": None, "error": None,
                  "size": f"{p.width}x{p.height}", "num_outputs": len(p.seeds), "file_names": [],
                  "revised_prompt": p.prompt, "output_format": resolved.output_format}
        record.update(extra)
        return record

    def _exists(self, record: dict[str, Any]) -> bool:
        current = self.store.get(record["id"])
        if current is None:
            return False
        record.update(status=current["status"])
        return True

    def _set_status(self, record: dict[str, Any], status: str, **changes: Any) -> bool:
        if status not in TRANSITIONS.get(record["status"], set()):
            return False  # terminal states are final; a late reply changes nothing
        record["status"] = status
        record.update(changes)
        if status in ("completed", "failed", "cancelled"):
            record["completed_at"] = now_s()
            if self.ttl_s > 0:
                record["expires_at"] = record["completed_at"] + int(self.ttl_s)
        self.store.save(record)
        return True

    def _progress(self, record: dict[str, Any], progress: int) -> None:
        progress = max(record["progress"], min(99, progress))
        if record["status"] == "queued":
            self._set_status(record, "in_progress", progress=progress)
        elif record["status"] == "in_progress" and progress != record["progress"]:
            record["progress"] = progress
            self.store.save(record)

    def _complete(self, record: dict[str, Any], result: GenerationResult) -> None:
        changes = {"progress": 100, "file_names": list(result.file_names),
                   "inference_time_s": result.inference_time_s,
                   "peak_memory_mb": result.peak_memory_mb,
                   "size": f"{result.width}x{result.height}"}
        if not self._set_status(record, "completed", **changes):
            self._delete_files(result.file_names)  # cancelled meanwhile: the files are orphans

    def _fail(self, record: dict[str, Any], exc: WorldserveError) -> None:
        code = _ERROR_CODES.get(exc.code, "generation_failed")
        if not self.store.get(record["id"]):
            return
        self._set_status(record, "failed", error={"message": exc.message, "code": code})

    # ------------------------------------------------------------------ files and retention

    def paths(self, record: dict[str, Any]) -> list[Path]:
        return [self.output_dir / name for name in record.get("file_names") or []]

    def _delete_files(self, names: list[str]) -> int:
        removed = 0
        for name in names:
            for path in (self.output_dir / name, self.output_dir / f".{name}.partial"):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    removed += 1
        return removed

    def _partial_files(self, record: dict[str, Any]) -> list[str]:
        return [p.name.removeprefix(".").removesuffix(".partial")
                for p in self.output_dir.glob(f".{record['id']}*.partial")]

    def remove(self, record: dict[str, Any]) -> int:
        """Delete a record and every file it owns (outputs and partial outputs)."""
        removed = self._delete_files(list(record.get("file_names") or []) + self._partial_files(record))
        self.store.delete(record["id"])
        return removed

    def recover(self) -> None:
        """Startup: live records of a previous run become failed (server_restart)."""
        for record in self.store.with_status(LIVE_STATUSES):
            self._delete_files(self._partial_files(record))
            self._set_status(record, "failed", error={
                "message": "server restarted before the job finished", "code": "server_restart"})
        self.prune()

    def prune(self) -> dict[str, Any]:
        """Remove expired records (and, past max_job_records, the oldest terminal ones)."""
        removed_ids: list[str] = []
        files = 0
        victims = self.store.expired(now_s())
        for record in victims:
            files += self.remove(record)
            removed_ids.append(record["id"])
        if self.max_records > 0:
            for record in self.store.oldest_terminal_over(self.max_records):
                files += self.remove(record)
                removed_ids.append(record["id"])
        return {"object": "outputs.prune", "removed_records": len(removed_ids),
                "removed_files": files, "ids": removed_ids}

    async def shutdown(self) -> None:
        """Orderly shutdown: live jobs become `cancelled` after the stage was asked to stop them."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        for video_id, task in list(self.tasks.items()):
            record = self.store.get(video_id, "video")
            if record is not None and record["status"] in LIVE_STATUSES:
                with contextlib.suppress(StageUnavailable):
                    self.client().send_nowait(Cancel(request_id=new_request_id("cancel"),
                                                     target_id=record["stage_request_id"]))
                self._set_status(record, "cancelled",
                                 error={"message": "server shut down before the job finished",
                                        "code": "cancelled"})
            task.cancel()
        await asyncio.sleep(0.05)  # let the cancellations reach the stage before it stops

    def start_sweeper(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # built outside an event loop (tests): no background sweeping
        if self._sweeper is None:
            self._sweeper = loop.create_task(self._sweep_forever())

    async def _sweep_forever(self) -> None:
        # Sweep at least as often as the TTL, so an expired output never lingers a full minute.
        interval = min(SWEEP_INTERVAL_S, max(1.0, self.ttl_s)) if self.ttl_s else SWEEP_INTERVAL_S
        while True:
            await asyncio.sleep(interval)
            try:
                report = self.prune()
            except Exception:  # the sweeper keeps running; the next pass retries
                log.exception("output sweep failed")
                continue
            if report["removed_records"]:
                log.info("swept %d expired record(s)", report["removed_records"])


def _expired(record: dict[str, Any]) -> bool:
    expires = record.get("expires_at")
    return expires is not None and expires <= now_s()
