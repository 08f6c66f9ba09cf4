"""Fixtures for reasoner engine tests: tiny checkpoints and an in-process engine driver."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import msgspec
import pytest
import torch

from tests.unit.reasoner import tiny_vlm
from worldserve.config import ReasonerStageConfig, ServerConfig, StreamingConfig
from worldserve.errors import from_code
from worldserve.ipc.messages import (
    CreateSession,
    ErrorReply,
    Message,
    ReasonerSampling,
    SessionFrame,
)

# Tiny models are Python-bound; two OpenMP threads only fight other processes on 2 cores.
torch.set_num_threads(1)

GREEDY = dict(temperature=0.0, repetition_penalty=1.0)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen2.5-VL tiny, P = M = 2048 (re-prefill every few dozen frames)."""
    return tiny_vlm.build(tmp_path_factory.mktemp("qwen25vl"))


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_vlm.build(tmp_path_factory.mktemp("qwen3vl"), family="qwen3_vl")


class Driver:
    """Runs an engine in-process the way the stage loop does (submit, then step)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.replies: list[Message] = []
        self._seq = 0

    def _id(self, prefix: str) -> str:
        self._seq += 1
        return f"{prefix}-{self._seq}"

    def submit(self, request: Any) -> None:
        self.engine.submit(request, self.replies.append)

    def run(self) -> None:
        while self.engine.has_work():
            self.engine.step()

    def call(self, request: Any) -> Message:
        """Submit, run to completion, return the terminal reply (ErrorReply raised)."""
        start = len(self.replies)
        self.submit(request)
        self.run()
        terminal = [r for r in self.replies[start:] if getattr(r, "terminal", True)]
        assert len(terminal) == 1, self.replies[start:]
        if isinstance(terminal[0], ErrorReply):
            raise from_code(terminal[0].code, terminal[0].message)
        return terminal[0]

    def create(self, session_id: str = "s1", retention: dict | None = None,
               sampling: dict | None = None, system_prompt: str = "Describe the frame.",
               question: str = "What happens?") -> Any:
        caps = self.engine.capabilities()
        ret = msgspec.structs.replace(caps.retention, **(retention or {}))
        return self.call(CreateSession(
            request_id=self._id("create"), session_id=session_id, system_prompt=system_prompt,
            question=question, retention=ret, sampling=ReasonerSampling(**(sampling or {}))))

    def frame(self, session_id: str, image: bytes) -> Any:
        return self.call(SessionFrame(request_id=self._id("frame"), session_id=session_id,
                                      image=image, received_at=time.time()))


@pytest.fixture
def make_engine(tiny_dir: Path) -> Callable[..., Driver]:
    from worldserve.engines.reasoner.engine import ReasonerEngine

    def make(model_dir: Path | None = None, **streaming: Any) -> Driver:
        stage = ReasonerStageConfig(model_path=model_dir or tiny_dir,
                                    streaming=StreamingConfig(**streaming))
        return Driver(ReasonerEngine(stage, ServerConfig()))

    return make


@pytest.fixture(scope="session", params=["cosmos3_omni", "cosmos3_edge"])
def cosmos3_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Cosmos3 reasoner dev checkpoint, once per architecture (Omni, Edge)."""
    from worldserve.models.cosmos3_reasoner.dev import write_reasoner_files

    target = tmp_path_factory.mktemp(request.param)
    # A short trained range (the dev builders use the real one): re-prefill tests reach their
    # trigger within a few dozen frames.
    write_reasoner_files(target, 0, request.param, max_position_embeddings=4096)
    return target
