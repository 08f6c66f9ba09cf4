"""The interface every engine implements, and the stage-name -> engine factory table.

A stage process owns one engine. Its loop is `receive -> engine.submit(...)`, then
`engine.step()` while `engine.has_work()`. Engines never block the loop for longer than one
unit of work (a denoising step, a decode step) so that cancellations and pings stay prompt.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Literal, Protocol

from worldserve.config import ServerConfig, StageConfig
from worldserve.ipc.capabilities import Capabilities
from worldserve.ipc.messages import Message, Request

ReplyFn = Callable[[Message], None]
EngineState = Literal["warming", "ready", "released"]

# (stage, backend) -> "module:EngineClass", called as `EngineClass(stage_config, server_config)`.
# The one factory table; imported lazily inside the stage process only (the api process never
# loads these modules). Stages without a `backend` setting use DEFAULT_BACKEND.
DEFAULT_BACKEND = "default"
ENGINE_FACTORIES: dict[tuple[str, str], str] = {
    # GenerationEngine, on one process or over a rank group (stages.generation.parallel)
    ("generation", DEFAULT_BACKEND):
        "worldserve.engines.generation.factory:create_generation_engine",
    ("reasoner", "hf"): "worldserve.engines.reasoner.engine:ReasonerEngine",
    ("reasoner", "fake"): "worldserve.engines.reasoner.fake:FakeReasonerEngine",
    ("realtime", "causal"): "worldserve.engines.realtime.engine:RealtimeEngine",
    ("realtime", "fake"): "worldserve.engines.realtime.fake:FakeRealtimeEngine",
}


class Engine(Protocol):
    model_name: str
    model_path: str
    num_params: int

    def capabilities(self) -> Capabilities | None:
        """Facts the api needs without a round trip (defaults, limits, feature flags)."""

    def state(self) -> EngineState:
        """`warming` while server-mode warmup runs (requests wait), then `ready`."""

    def submit(self, request: Request, reply: ReplyFn) -> None:
        """Accept one request; replies go through `reply` now or from a later `step()`."""

    def cancel(self, request_id: str) -> None:
        """Stop `request_id` at the next step boundary (no-op when unknown)."""

    def has_work(self) -> bool: ...

    def step(self) -> None:
        """Run one bounded unit of work."""

    def stats(self) -> dict[str, Any]:
        """`queue_depth`, `running`, `sessions` and optional `extra`."""

    def shutdown(self) -> None: ...


def create_engine(stage: str, stage_config: StageConfig, server_config: ServerConfig) -> Engine:
    backend = getattr(stage_config, "backend", DEFAULT_BACKEND)
    try:
        target = ENGINE_FACTORIES[(stage, backend)]
    except KeyError:
        raise ValueError(f"no engine is registered for stage {stage!r} with backend "
                         f"{backend!r}") from None
    from worldserve.runtime.devices import resolve_in_process

    module_name, func_name = target.split(":")
    factory = getattr(importlib.import_module(module_name), func_name)
    # the supervisor's plan made device and dtype concrete; in-process and Ray engines
    # resolve `auto` here
    return factory(resolve_in_process(stage_config), server_config)
