"""The generation engine's operator operations (POST /admin/...), applied between two steps.

The stage loop is one thread and an engine step is one runner phase, so every operation runs
at a step boundary by construction. Pause and drain are the scheduler's state
(`Scheduler.pause_state`); this module sets it and never touches the scheduler's queues. What
each operation does to running work:

- pause / continue: while paused (`PAUSED_ALL`) no phase runs (running batches hold where they
  are, new requests queue); nothing is dropped.
- LoRA load / unload: immediate. Running batches are unaffected: the engine activates each
  batch's own adapter selection before every phase of it. Unloading an adapter that a queued
  or running request selected is refused (409).
- weights update and memory release drain first (`PAUSED_NEW`): no new batch starts, running
  batches finish on the old weights (resp. on the device), then the operation applies and the
  admin call answers. Queued requests then run on the new weights; after a release they fail
  with 503 `model weights released`, as new requests do until resume.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from worldserve.engines.generation.contract import (
    DescribedRunner,
    GenerationRunner,
    LoraRunner,
    LoraSelection,
    OffloadRunner,
    WeightsRunner,
)
from worldserve.engines.generation.scheduler import PauseState, Scheduler
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

RELEASED_MESSAGE = "model weights released"
MAX_LORA_SCALE = 100.0


def released_error() -> WeightsReleased:
    return WeightsReleased(f"{RELEASED_MESSAGE}: POST /admin/memory/resume brings them back",
                           stage="generation")


@dataclass(frozen=True)
class ServedModel:
    """What /admin/model_info says about the stage besides the runner's own facts."""

    name: str
    path: str
    dtype: str
    device: str
    num_params: int
    action_head: dict[str, Any] | None  # the action head's metadata, None without one
    # VAE decode settings in force: tiling (tile_size, tile_stride), decode_chunk_frames
    vae: dict[str, Any] = field(default_factory=dict)


class GenerationAdmin:
    """Memory state and the drained operations waiting for running work; sets the scheduler's
    pause state and asks the scheduler (never its queues) about queued and running work."""

    def __init__(self, runner: GenerationRunner, scheduler: Scheduler,
                 served: ServedModel) -> None:
        self.runner = runner
        self.scheduler = scheduler
        self.served = served
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
            if self.scheduler.pause_state is PauseState.UNPAUSED:
                self.scheduler.set_pause_state(PauseState.PAUSED_NEW)  # drain
            self.apply_due()
            return
        handler = self._handlers.get(type(msg))
        if handler is None:
            raise InvalidRequest(f"the generation stage does not handle {type(msg).__name__}")
        reply(AdminResult(request_id=msg.request_id, data=handler(msg)))

    @property
    def paused(self) -> bool:
        return self.scheduler.paused

    def apply_due(self) -> bool:
        """Apply the waiting operations once nothing runs; True when one was applied."""
        if not self.pending or self.scheduler.running:
            return False
        pending, self.pending = self.pending, []
        if self.scheduler.pause_state is PauseState.PAUSED_NEW:
            self.scheduler.set_pause_state(PauseState.UNPAUSED)  # drained
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
        runner = self.runner
        if not isinstance(runner, LoraRunner):
            raise InvalidRequest("this model does not support LoRA adapters", param="lora")
        selection = runner.resolve_lora([(r.name, r.scale) for r in refs])
        return [LoraRef(name=name, scale=scale) for name, scale in selection]

    def activate(self, refs: list[LoraRef]) -> None:
        """Make a batch's selection active before one of its phases runs."""
        runner = self.runner
        if isinstance(runner, LoraRunner):
            runner.activate_lora(selection_of(refs))

    # ------------------------------------------------------------------ operations

    def model_info(self) -> dict[str, Any]:
        runner, served = self.runner, self.served
        described = runner.describe() if isinstance(runner, DescribedRunner) else {}
        features = runner.features
        head = served.action_head
        tasks = ["images", "videos"] + (["actions"] if head or features.action_generation else [])
        domains = sorted((features.action_domains or {}) if features.action_generation else {})
        return {
            "stage": "generation", "model": served.name, "path": served.path,
            "family": described.get("family", features.family),
            "pipeline": described.get("pipeline", type(runner.pipe).__name__),
            "dtype": described.get("dtype", served.dtype),
            "device": described.get("device", served.device),
            "num_params": served.num_params, "tasks": tasks, "action_domains": domains,
            "action_head": head, "sound": features.sound,
            "lora": {"supported": isinstance(runner, LoraRunner),
                     "adapters": described.get("lora", [])},
            "weights_update": isinstance(runner, WeightsRunner),
            "memory": "released" if self.released else "resident",
            "memory_release": isinstance(runner, OffloadRunner),
            "paused": self.paused,
            "rank_group": described.get("rank_group"),  # stages.generation.parallel: the ranks
            # attention_backend / compile (and Cosmos3's understanding K/V reuse) in force
            "speed": described.get("speed", {"attention_backend": "native", "compile": False}),
            "vae": served.vae,
        }

    def _lora(self) -> LoraRunner:
        runner = self.runner
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
        users = self.scheduler.users_of(msg.name)
        if users:
            raise Conflict(f"LoRA adapter '{msg.name}' is selected by {len(users)} queued or "
                           f"running request(s); unload it when they finish")
        runner.unload_lora(msg.name)
        return {"unloaded": msg.name, "adapters": runner.list_lora()}

    def _set_paused(self, paused: bool) -> dict[str, Any]:
        changed = paused != self.paused
        unpaused = PauseState.PAUSED_NEW if self.pending else PauseState.UNPAUSED
        self.scheduler.set_pause_state(PauseState.PAUSED_ALL if paused else unpaused)
        return {"paused": paused, "changed": changed, "running": self.scheduler.num_running(),
                "queued": len(self.scheduler)}

    def _check_drainable(self, msg: AdminRequest) -> None:
        runner = self.runner
        if isinstance(msg, WeightsUpdate) and not isinstance(runner, WeightsRunner):
            raise NotSupported("this model's runner does not support weight updates")
        if isinstance(msg, MemoryRelease) and not isinstance(runner, OffloadRunner):
            raise NotSupported("this model's runner does not support memory release")
        if isinstance(msg, WeightsUpdate) and self.released:
            raise released_error()
        if self.paused and self.scheduler.running:
            raise Conflict(f"generation is paused with {self.scheduler.num_running()} running "
                           f"request(s), which must finish first: continue generation first")

    def _apply(self, msg: AdminRequest) -> dict[str, Any]:
        if isinstance(msg, WeightsUpdate):
            assert isinstance(self.runner, WeightsRunner)  # _check_drainable refused otherwise
            data = self.runner.update_weights(msg.path)
            return {**data, "running_requests": "finished on the old weights"}
        return self._release()

    def _release(self) -> dict[str, Any]:
        if self.released:
            return {"memory": "released", "changed": False}
        assert isinstance(self.runner, OffloadRunner)  # _check_drainable refused otherwise
        data = self.runner.release_memory()
        self.released = True
        failed = self._fail_waiting(released_error())
        return {**data, "memory": "released", "changed": True, "failed_queued": failed}

    def _fail_waiting(self, error: WorldserveError) -> int:
        """Fail every queued (not yet running) request with `error`; returns how many."""
        requests, actions = self.scheduler.fail_waiting()
        replies = [(r.request_id, r.payload.reply) for r in requests]
        replies += [(msg.request_id, reply) for msg, reply in actions]
        for request_id, reply in replies:
            reply(ErrorReply(request_id=request_id, code=error.code, message=error.message))
        return len(replies)

    def _resume(self) -> dict[str, Any]:
        if not self.released:
            return {"memory": "resident", "changed": False}
        runner = self.runner
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
