"""The generation stage's engine factory (the `runtime/engine.py` factory table names it): one
process as always, or a rank group when `stages.generation.parallel` asks for several ranks.

It lives in the engine's room, not beside the rank group, so that `ranks/` and `runtime/` never
import an engine: the engine starts its own ranks, as vLLM-Omni's diffusion engine launches its
workers.
"""

from __future__ import annotations

from typing import Any

from worldserve.config import GenerationStageConfig, ServerConfig


def create_generation_engine(stage_config: GenerationStageConfig,
                             server_config: ServerConfig) -> Any:
    """The generation stage's engine (runtime/engine.py factory table): on one process as
    always, or over a rank group when `stages.generation.parallel` asks for several ranks."""
    from worldserve.engines.common import model_dir
    from worldserve.engines.generation.engine import GenerationEngine
    from worldserve.runtime.devices import resolve_in_process

    stage_config = resolve_in_process(stage_config)
    runner = None
    if stage_config.parallel.world_size > 1:
        from worldserve.ranks.runner import start_rank_runner

        runner = start_rank_runner(stage_config, model_dir(stage_config),
                                   log_level=server_config.log_level)
    return GenerationEngine(stage_config, server_config, runner=runner)
