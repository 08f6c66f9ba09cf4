"""Realtime backends: `causal` (the causal video diffusion model) and `fake`."""

from __future__ import annotations

from typing import Any

from worldserve.config import RealtimeStageConfig, ServerConfig


def create_engine(stage_config: RealtimeStageConfig, server_config: ServerConfig) -> Any:
    if stage_config.backend == "fake":
        from worldserve.engines.realtime.fake import FakeRealtimeEngine

        return FakeRealtimeEngine(stage_config, server_config)
    from worldserve.engines.realtime.engine import RealtimeEngine

    return RealtimeEngine(stage_config, server_config)
