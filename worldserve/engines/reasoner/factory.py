"""Reasoner backends behind one session interface: `hf` (transformers) and `fake`."""

from __future__ import annotations

from typing import Any

from worldserve.config import ReasonerStageConfig, ServerConfig


def create_engine(stage_config: ReasonerStageConfig, server_config: ServerConfig) -> Any:
    if stage_config.backend == "fake":
        from worldserve.engines.reasoner.fake import FakeReasonerEngine

        return FakeReasonerEngine(stage_config, server_config)
    from worldserve.engines.reasoner.engine import ReasonerEngine

    return ReasonerEngine(stage_config, server_config)
