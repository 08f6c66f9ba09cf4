"""Fixtures for the realtime engine unit tests: the tiny causal model, built in memory."""

from __future__ import annotations

import pytest
import torch

from tests.support.torch_threads import one_torch_thread  # noqa: F401
from worldserve.config import RealtimeStageConfig, ServerConfig
from worldserve.engines.realtime.engine import RealtimeEngine
from worldserve.models.causal_dit.dev import build_realtime_model
from worldserve.models.causal_dit.runner import CausalRunner


@pytest.fixture(scope="session")
def rt_model():
    torch.manual_seed(0)
    return build_realtime_model(0)


@pytest.fixture
def make_engine(rt_model):
    def make(**config) -> RealtimeEngine:
        return RealtimeEngine(RealtimeStageConfig(**config), ServerConfig(),
                              runner=CausalRunner(rt_model))

    return make
