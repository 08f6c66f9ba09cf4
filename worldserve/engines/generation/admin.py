"""The generation engine's operator operations (POST /admin/...), applied between two steps.

The stage loop is one thread and an engine step is one runner phase, so every operation runs
at a step boundary by construction. What each does to running work:

- pause / continue: while paused no phase runs (running batches hold where they are, new
  requests queue); nothing is dropped.
- LoRA load / unload: immediate. Running batches are unaffected: the engine activates each
  batch's own adapter selection before every phase of it. Unloading an adapter that a queued
  or running request selected is refused (409).
- weights update and memory release drain first: no new batch starts, running batches finish
  on the old weights (resp. on the device), then the operation applies and the admin call
  answers. Queued requests then run on the new weights; after a release they fail with 503
  `model weights released`, as new requests do until resume.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from worldserve.engines.generation.contract import (
    DescribedRunner,
    LoraRunner,
    LoraSelection,
    OffloadRunner,
    WeightsRunner,
)
from worldserve.engines.generation.scheduler import RequestStatus
from worldserve.errors import (
    Conflict,
    InternalError,
    InvalidRequest,
    NotSupported,
    WeightsReleased,
    WorldserveError,
)
from worldserve.ipc.messages import (
    AdminRequest,
    AdminResult,
    ErrorReply,
    GenerationContinue,
    GenerationPause,
    LoraList,
    LoraLoad,
    LoraRef,
    LoraUnload,
    MemoryRelease,
    MemoryResume,
    ModelInfoRequest,
    WeightsUpdate,
)
from worldserve.runtime.engine import ReplyFn

if TYPE_CHECKING:
    from worldserve.engines.generation.engine import GenerationEngine

RELEASED_MESSAGE = "model weights released"
MAX_LORA_SCALE = 100.0


def released_error() -> WeightsReleased:
    return WeightsReleased(f"{RELEASED_MESSAGE}: POST /admin/memory/resume brings them back",
                           stage="generation")


class GenerationAdmin:
    """Pause state, memory state and the drained operations waiting for running work."""

    def __init__(self, engine: GenerationEngine) -> None:
        self.engine = engine
        self.paused = False
        self.released = False
        self.pending: list[tuple[AdminRequest, ReplyFn, float]] = []
        self._handlers: dict[type, Callable[[Any], dict[str, Any]]] = {
            ModelInfoRequest: lambda _: self.model_info(),
            LoraList: lambda _: {"adapters": self._lora().list_lora()},
            LoraLoad: self._load_lora,
            LoraUnload: self._unload_lora,
            GenerationPause: lambda _: self._set_paused(True),
            GenerationContinue: lambda _: self._set_paused(False),
            MemoryResume: lambda _: self._resume(),
        }

    # ------------------------------------------------------------------ entry points

    def submit(self, msg: AdminRequest, reply: ReplyFn) -> None:
        """Answer now, or (weights update, memory release) once running batches finish."""
        if isinstance(msg, (WeightsUpdate, MemoryRelease)):
            self._check_drainable(msg)
            self.pending.append((msg, reply, time.perf_counter()))
            self.apply_due()
            return
        handler = self._handlers.get(type(msg))
        if handler is None:
            raise InvalidRequest(f"the generation stage does not handle {type(msg).__name__}")
        reply(AdminResult(request_id=msg.request_id, data=handler(msg)))

    def blocks_admission(self) -> bool:
        """No new batch starts while a drained operation waits."""
        return bool(self.pending)

    def apply_due(self) -> bool:
        """Apply the waiting operations once nothing runs; True when one was applied."""
        if not self.pending or self.engine.running:
            return False
        pending, self.pending = self.pending, []
        for msg, reply, queued_s in pending:
            waited_ms = (time.perf_counter() - queued_s) * 1000
            try:
                data = self._apply(msg)
            except Exception as exc:
                error = _as_error(exc)
                reply(ErrorReply(request_id=msg.request_id, code=error.code,
                                 message=error.message))
                continue
            reply(AdminResult(request_id=msg.request_id,
                              data={**data, "waited_for_running_ms": round(waited_ms, 3)}))
        return True

    def check_servable(self) -> None:
        if self.released:
            raise released_error()

    # ------------------------------------------------------------------ per-request LoRA

    def resolve(self, refs: list[LoraRef]) -> list[LoraRef]:
        """A request's adapters with their scales filled in; 400 for an unknown name."""
        if not refs:
            return []
        runner = self.engine.runner
        if not isinstance(runner, LoraRunner):
            raise InvalidRequest("this model does not support LoRA adapters", param="lora")
        selection = runner.resolve_lora([(r.name, r.scale) for r in refs])
        return [LoraRef(name=name, scale=scale) for name, scale in selection]

    def activate(self, refs: list[LoraRef]) -> None:
        """Make a batch's selection active before one of its phases runs."""
        runner = self.engine.runner
        if isinstance(runner, LoraRunner):
            runner.activate_lora(selection_of(refs))

    # ------------------------------------------------------------------ operations

    def model_info(self) -> dict[str, Any]:
        engine = self.engine
        runner = engine.runner
        described = runner.describe() if isinstance(runner, DescribedRunner) else {}
        features = getattr(runner, "features", None)
        generates_actions = bool(features and features.action_generation)
        head = engine.actions.metadata() if engine.actions is not None else None
        tasks = ["images", "videos"] + (["actions"] if head or generates_actions else [])
        domains = sorted((features.action_domains or {}) if generates_actions else {})
        return {
            "stage": "generation", "model": engine.model_name, "path": engine.model_path,
            "family": described.get("family", getattr(features, "family", None)),
            "pipeline": described.get("pipeline", type(engine.pipe).__name__),
            "dtype": described.get("dtype", engine.config.dtype),
            "device": described.get("device", engine.config.device),
            "num_params": engine.num_params, "tasks": tasks, "action_domains": domains,
            "action_head": head, "sound": bool(features and features.sound),
            "lora": {"supported": isinstance(runner, LoraRunner),
                     "adapters": described.get("lora", [])},
            "weights_update": isinstance(runner, WeightsRunner),
            "memory": "released" if self.released else "resident",
            "memory_release": isinstance(runner, OffloadRunner),
            "paused": self.paused,
            "rank_group": described.get("rank_group"),  # stages.generation.parallel: the ranks
        }

    def _lora(self) -> LoraRunner:
        runner = self.engine.runner
        if not isinstance(runner, LoraRunner):
            raise NotSupported("this model's runner does not support LoRA adapters")
        return runner

    def _load_lora(self, msg: LoraLoad) -> dict[str, Any]:
        if not abs(msg.scale) <= MAX_LORA_SCALE:
            raise InvalidRequest(f"scale must be within ±{MAX_LORA_SCALE:g}", param="scale")
        loaded = self._lora().load_lora(msg.name, msg.path, msg.scale, msg.path_2)
        return {"loaded": loaded, "adapters": self._lora().list_lora()}

    def _unload_lora(self, msg: LoraUnload) -> dict[str, Any]:
        runner = self._lora()
        runner.resolve_lora([(msg.name, None)])  # 400 for an unknown name
        users = self._users_of(msg.name)
        if users:
            raise Conflict(f"LoRA adapter '{msg.name}' is selected by {len(users)} queued or "
                           f"running request(s); unload it when they finish")
        runner.unload_lora(msg.name)
        return {"unloaded": msg.name, "adapters": runner.list_lora()}

    def _users_of(self, name: str) -> list[str]:
        engine = self.engine
        users = [rid for rid, request in engine.by_id.items()
                 if any(ref.name == name for ref in request.params.lora)]
        users += [msg.request_id for msg, _ in engine.action_queue
                  if any(ref.name == name for ref in msg.lora)]
        return users

    def _set_paused(self, paused: bool) -> dict[str, Any]:
        changed = paused != self.paused
        self.paused = paused
        return {"paused": paused, "changed": changed, "running": self.engine.num_running(),
                "queued": len(self.engine.scheduler)}

    def _check_drainable(self, msg: AdminRequest) -> None:
        runner = self.engine.runner
        if isinstance(msg, WeightsUpdate) and not isinstance(runner, WeightsRunner):
            raise NotSupported("this model's runner does not support weight updates")
        if isinstance(msg, MemoryRelease) and not isinstance(runner, OffloadRunner):
            raise NotSupported("this model's runner does not support memory release")
        if isinstance(msg, WeightsUpdate) and self.released:
            raise released_error()
        if self.paused and self.engine.running:
            raise Conflict(f"generation is paused with {self.engine.num_running()} running "
                           f"request(s), which must finish first: continue generation first")

    def _apply(self, msg: AdminRequest) -> dict[str, Any]:
        if isinstance(msg, WeightsUpdate):
            data = self.engine.runner.update_weights(msg.path)  # type: ignore[attr-defined]
            return {**data, "running_requests": "finished on the old weights"}
        return self._release()

    def _release(self) -> dict[str, Any]:
        if self.released:
            return {"memory": "released", "changed": False}
        data = self.engine.runner.release_memory()  # type: ignore[attr-defined]
        self.released = True
        failed = self._fail_waiting(released_error())
        return {**data, "memory": "released", "changed": True, "failed_queued": failed}

    def _fail_waiting(self, error: WorldserveError) -> int:
        """Fail every queued (not yet running) request with `error`; returns how many."""
        engine, failed = self.engine, 0
        while engine.scheduler.waiting:
            request = engine.scheduler.waiting.popleft()
            request.transition(RequestStatus.FAILED)
            engine.by_id.pop(request.request_id, None)
            request.payload.reply(ErrorReply(request_id=request.request_id, code=error.code,
                                             message=error.message))
            failed += 1
        for msg, reply in engine.action_queue:
            reply(ErrorReply(request_id=msg.request_id, code=error.code, message=error.message))
            failed += 1
        engine.action_queue.clear()
        return failed

    def _resume(self) -> dict[str, Any]:
        if not self.released:
            return {"memory": "resident", "changed": False}
        runner = self.engine.runner
        assert isinstance(runner, OffloadRunner)
        data = runner.resume_memory()
        self.released = False
        return {**data, "memory": "resident", "changed": True}


def selection_of(refs: list[LoraRef]) -> LoraSelection:
    return tuple((ref.name, float(ref.scale if ref.scale is not None else 1.0)) for ref in refs)


def _as_error(exc: Exception) -> WorldserveError:
    if isinstance(exc, WorldserveError):
        return exc
    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return InternalError(first_line)
