"""Reasoner stage engine. Loads a Qwen-VL-family checkpoint at startup."""

from __future__ import annotations

from typing import Any

from worldserve.config import ReasonerStageConfig, ServerConfig
from worldserve.engines.common import (
    ModelLoadError,
    count_parameters,
    model_dir,
    served_model_name,
    torch_dtype,
    unsupported,
)
from worldserve.ipc.messages import Request
from worldserve.runtime.engine import EngineState, ReplyFn


class ReasonerEngine:
    def __init__(self, stage_config: ReasonerStageConfig, server_config: ServerConfig) -> None:
        from transformers import AutoModelForImageTextToText

        path = model_dir(stage_config)
        try:
            self.model = AutoModelForImageTextToText.from_pretrained(
                str(path), dtype=torch_dtype(stage_config.dtype), local_files_only=True
            ).eval()
        except Exception as exc:
            raise ModelLoadError(f"cannot load a vision-language model from {path}: {exc}") from exc
        self.model.to(stage_config.device)
        self.model_name = served_model_name(stage_config, path)
        self.model_path = str(path)
        self.num_params = count_parameters(self.model)

    def capabilities(self) -> dict[str, Any]:
        return {"architecture": type(self.model).__name__}

    def state(self) -> EngineState:
        return "ready"

    def submit(self, request: Request, reply: ReplyFn) -> None:
        raise unsupported(request, "reasoner")

    def cancel(self, request_id: str) -> None:
        pass

    def has_work(self) -> bool:
        return False

    def step(self) -> None:
        pass

    def stats(self) -> dict[str, Any]:
        return {"queue_depth": 0, "running": 0, "sessions": 0}

    def shutdown(self) -> None:
        pass


def create_engine(stage_config: ReasonerStageConfig, server_config: ServerConfig) -> ReasonerEngine:
    return ReasonerEngine(stage_config, server_config)
