"""Synthetic warmup requests (spec native-media.md §6).

`server`: the stage reports `warming` until the warmup requests finish (requests arriving
meanwhile queue behind them). A failure is a warning, unless `warmup_resolutions` were given
explicitly: then the stage exits and startup fails. `off`: the stage is ready at once and one
denoising step of the same synthetic request runs first in the background.

Size: the model's smallest (one `size_multiple` square, the fewest frames that still take the
video path), so that a start-up on a CPU does not denoise a full-size frame; every phase
(prepare, denoise, decode) still runs once. Explicit `warmup_resolutions` are used as given;
with `compile` the warmup runs at the representative size of native-media §6 (area <= 832x480,
at most 17 frames), because compiled graphs are specialised to the shapes they saw.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

from worldserve.config import GenerationStageConfig
from worldserve.ipc.capabilities import GenerationDefaults
from worldserve.ipc.messages import ErrorReply, GenerationParams, Message, Reply

log = logging.getLogger("worldserve.generation.warmup")

MAX_WARMUP_AREA = 832 * 480
MAX_WARMUP_FRAMES = 17
WARMUP_PROMPT = "warmup"


@dataclass
class WarmupPlan:
    blocking: bool
    explicit: bool
    params: list[GenerationParams] = field(default_factory=list)
    num_finished: int = 0
    num_failed: int = 0

    @property
    def done(self) -> bool:
        return self.num_finished >= len(self.params)

    @classmethod
    def create(
        cls, config: GenerationStageConfig, defaults: GenerationDefaults, runner
    ) -> "WarmupPlan":
        explicit = bool(config.warmup_resolutions)
        # compile: the warmup pays the compilation, so requests wait for it (never the first one)
        blocking = config.warmup_mode == "server" or explicit or config.compile
        steps = min(defaults.num_inference_steps, max(config.warmup_steps, 2)) if blocking else 1
        sizes, frames = _sizes(config, defaults, runner)
        params = [
            GenerationParams(
                prompt=WARMUP_PROMPT,
                width=w,
                height=h,
                num_frames=frames,
                num_inference_steps=steps,
                guidance_scale=defaults.guidance_scale,
                negative_prompt=defaults.negative_prompt,
                seeds=[defaults.seed],
                max_sequence_length=defaults.max_sequence_length,
            )
            for w, h in sizes
        ]
        for p in params:
            runner.check(p)  # a bad explicit resolution fails startup right here
        return cls(blocking=blocking, explicit=explicit, params=params)

    def requests(self) -> list[GenerationParams]:
        return list(self.params)

    def on_reply(self, reply: Message) -> None:
        if not isinstance(reply, Reply) or not reply.terminal:
            return
        self.num_finished += 1
        if isinstance(reply, ErrorReply):
            self.num_failed += 1
            if self.explicit:
                raise SystemExit(
                    f"stage generation failed to start: warmup at the explicit "
                    f"warmup_resolutions failed: {reply.message}"
                )
            log.warning("warmup request failed (continuing): %s", reply.message)
        if self.done:
            log.info(
                "warmup finished (%d request(s), %d failed)", len(self.params), self.num_failed
            )


def _sizes(config: GenerationStageConfig, defaults: GenerationDefaults,
           runner) -> tuple[list[tuple[int, int]], int]:
    """The warmup's sizes (width, height) and frame count (see the module docstring)."""
    frames = runner.snap_frames(min(defaults.num_frames, MAX_WARMUP_FRAMES))
    if config.warmup_resolutions:
        return [(int(w), int(h)) for w, h in
                (s.lower().split("x") for s in config.warmup_resolutions)], frames
    if config.compile:
        return [_representative_size(defaults.width, defaults.height,
                                     runner.size_multiple)], frames
    fewest = runner.snap_frames(min(defaults.num_frames, runner.temporal_stride + 1))
    return [(runner.size_multiple, runner.size_multiple)], fewest


def _representative_size(width: int, height: int, multiple: int) -> tuple[int, int]:
    """The default size scaled down to an area <= 832x480, aligned to the model's stride."""
    scale = min(1.0, math.sqrt(MAX_WARMUP_AREA / (width * height)))
    w = max(multiple, int(width * scale) // multiple * multiple)
    h = max(multiple, int(height * scale) // multiple * multiple)
    return w, h
