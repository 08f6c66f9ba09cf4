"""`SleepGenerationEngine`: a generation engine whose device time is a sleep (tests, benchmarks).

Each denoising step blocks the engine for `STEP_S`, as a busy device would; one request runs at a
time. It writes `<output_stem>[_i].<ext>` files that name the process that wrote them, so a test
can tell which replica ran a job. Built through `ClusterOptions.engine_targets`
("worldserve.cluster.fake:SleepGenerationEngine").
"""

from __future__ import annotations

import collections
import os
import time
from dataclasses import dataclass
from typing import Any

from worldserve.config import GenerationStageConfig, ServerConfig
from worldserve.engines.common import unsupported
from worldserve.ipc.capabilities import GenerationCapabilities, GenerationDefaults
from worldserve.ipc.messages import (
    GenerateMedia,
    GenerationAccepted,
    GenerationCancelled,
    GenerationProgress,
    GenerationResult,
    Request,
)
from worldserve.runtime.engine import EngineState, ReplyFn

STEP_S = 0.05


@dataclass
class _Job:
    msg: GenerateMedia
    reply: ReplyFn
    steps_done: int = 0
    started_at: float = 0.0


class SleepGenerationEngine:
    model_name, model_path, num_params = "sleep-gen", "/models/sleep-gen", 1

    def __init__(self, stage_config: GenerationStageConfig, server_config: ServerConfig) -> None:
        self.output_dir = stage_config.resolved_output_dir()
        self.queue: collections.deque[_Job] = collections.deque()
        self.num_finished = 0

    def capabilities(self) -> GenerationCapabilities:
        defaults = GenerationDefaults(width=64, height=64, num_frames=5, num_inference_steps=4,
                                      image_width=64, image_height=64)
        return GenerationCapabilities(pipeline="sleep", defaults=defaults,
                                      image_conditioning=False, output_dir=str(self.output_dir))

    def state(self) -> EngineState:
        return "ready"

    def submit(self, request: Request, reply: ReplyFn) -> None:
        if not isinstance(request, GenerateMedia):
            raise unsupported(request, "generation")
        params = request.params
        reply(GenerationAccepted(request_id=request.request_id, num_frames=params.num_frames,
                                 width=params.width, height=params.height,
                                 queue_position=len(self.queue)))
        self.queue.append(_Job(request, reply))

    def cancel(self, request_id: str) -> None:
        for job in list(self.queue):
            if job.msg.request_id == request_id:
                self.queue.remove(job)
                job.reply(GenerationCancelled(request_id=request_id))

    def has_work(self) -> bool:
        return bool(self.queue)

    def step(self) -> None:
        job = self.queue[0]
        if job.steps_done == 0:
            job.started_at = time.perf_counter()
        time.sleep(STEP_S)
        job.steps_done += 1
        total = job.msg.params.num_inference_steps
        if job.steps_done < total:
            job.reply(GenerationProgress(request_id=job.msg.request_id,
                                         progress=int(90 * job.steps_done / total),
                                         steps_done=job.steps_done, steps_total=total))
            return
        self.queue.popleft()
        job.reply(self._finish(job))

    def _finish(self, job: _Job) -> GenerationResult:
        msg = job.msg
        n = len(msg.params.seeds)
        names = [f"{msg.output_stem}{'' if n == 1 else f'_{i}'}.{msg.output_format}"
                 for i in range(n)]
        self.output_dir.mkdir(parents=True, exist_ok=True)
        for name in names:
            (self.output_dir / name).write_bytes(f"written by pid {os.getpid()}".encode())
        self.num_finished += 1
        return GenerationResult(request_id=msg.request_id, file_names=names,
                                width=msg.params.width, height=msg.params.height,
                                num_frames=msg.params.num_frames,
                                inference_time_s=time.perf_counter() - job.started_at)

    def stats(self) -> dict[str, Any]:
        return {"queue_depth": len(self.queue), "running": min(1, len(self.queue)),
                "extra": {"finished": self.num_finished}}

    def shutdown(self) -> None:
        self.queue.clear()
