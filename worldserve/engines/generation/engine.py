"""Generation stage engine. Loads a diffusers pipeline directory at startup."""

from __future__ import annotations

from typing import Any

from worldserve.config import GenerationStageConfig, ServerConfig
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


class GenerationEngine:
    def __init__(self, stage_config: GenerationStageConfig, server_config: ServerConfig) -> None:
        from diffusers import DiffusionPipeline

        path = model_dir(stage_config)
        try:
            self.pipe = DiffusionPipeline.from_pretrained(
                str(path), torch_dtype=torch_dtype(stage_config.dtype), local_files_only=True
            )
        except Exception as exc:
            raise ModelLoadError(f"cannot load a diffusers pipeline from {path}: {exc}") from exc
        self.pipe.to(stage_config.device)
        self.model_name = served_model_name(stage_config, path)
        self.model_path = str(path)
        self.num_params = count_parameters(*self.pipe.components.values())

    def capabilities(self) -> dict[str, Any]:
        return {"pipeline": type(self.pipe).__name__}

    def state(self) -> EngineState:
        return "ready"

    def submit(self, request: Request, reply: ReplyFn) -> None:
        raise unsupported(request, "generation")

    def cancel(self, request_id: str) -> None:
        pass

    def has_work(self) -> bool:
        return False

    def step(self) -> None:
        pass

    def stats(self) -> dict[str, Any]:
        return {"queue_depth": 0, "running": 0}

    def shutdown(self) -> None:
        pass


def create_engine(stage_config: GenerationStageConfig, server_config: ServerConfig) -> GenerationEngine:
    return GenerationEngine(stage_config, server_config)
