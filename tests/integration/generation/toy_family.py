"""A throwaway generation family, defined only here (docs/architecture.md "Adding a model
family"): its declaration, its loader and a trivial numpy runner that satisfies the generation
runner contract. `test_family_plugin.py` registers it as a plugin (an entry point in
`worldserve.model_families`) and serves it through a real `worldserve serve`.

What it draws is checkable from outside: every frame of a row is one colour,
`pixel(seed, steps_run)`, so a test knows which seed and how many denoising steps the engine
ran for it without going through the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from worldserve.errors import InvalidRequest
from worldserve.ipc.capabilities import GenerationDefaults
from worldserve.ipc.messages import GenerationParams
from worldserve.models.detect import diffusers_class
from worldserve.models.types import ModelFamily, RunnerFeatures

PIPELINE = "ToyPipeline"
# Distinctive on purpose: a request that omits a field gets these, and the test sees them.
DEFAULTS = GenerationDefaults(width=48, height=32, num_frames=5, fps=4, num_inference_steps=3,
                              guidance_scale=1.0, image_width=40, image_height=24,
                              image_response_format="b64_json")
SIZE_MULTIPLE = 8


def pixel(seed: int, steps: int) -> tuple[int, int, int]:
    """The uint8 RGB colour of a row with `seed` after `steps` denoising steps."""
    return (seed % 251, (17 * steps) % 251, 200)


def detect(model_dir: Path) -> bool:
    return diffusers_class(model_dir) == PIPELINE


FAMILY = ModelFamily(name="toy", detect=detect,
                     loaders={"generation": f"{__name__}:load_runner"})


class ToyPipeline:
    """Stands in for a loaded pipeline (the capabilities name its class)."""


@dataclass
class ToyBatch:
    row_owner: list[str]
    seeds: list[int]
    frames: int
    width: int
    height: int
    num_steps: int
    step_index: int = 0

    @property
    def done_denoising(self) -> bool:
        return self.step_index >= self.num_steps

    def keep_rows(self, keep: list[int]) -> None:
        self.row_owner = [self.row_owner[i] for i in keep]
        self.seeds = [self.seeds[i] for i in keep]


class ToyRunner:
    max_batch_size: int | None = None
    size_multiple = SIZE_MULTIPLE
    temporal_stride = 4
    num_params = 0

    def __init__(self) -> None:
        self.pipe = ToyPipeline()
        self.features = RunnerFeatures(family=FAMILY.name, defaults=DEFAULTS)

    def snap_frames(self, num_frames: int) -> int:
        return max(1, num_frames)

    def check(self, params: GenerationParams) -> None:
        for name in ("width", "height"):
            if getattr(params, name) % SIZE_MULTIPLE:
                raise InvalidRequest(f"{name} must be a multiple of {SIZE_MULTIPLE}", param=name)

    def prepare(self, row_owner: list[str], rows: list[GenerationParams],
                seeds: list[int]) -> ToyBatch:
        first = rows[0]
        return ToyBatch(list(row_owner), list(seeds), first.num_frames, first.width,
                        first.height, first.num_inference_steps)

    def denoise_step(self, state: ToyBatch) -> None:
        state.step_index += 1

    def decode(self, state: ToyBatch, row: int) -> np.ndarray:
        colour = np.array(pixel(state.seeds[row], state.step_index), np.float32) / 255.0
        return np.broadcast_to(colour, (state.frames, state.height, state.width, 3)).copy()

    def extras(self, state: ToyBatch, row: int) -> None:
        return None


def load_runner(model_dir: Path, **_options: object) -> ToyRunner:
    return ToyRunner()
