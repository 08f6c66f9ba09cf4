"""Warm-up sizes (engines/generation/warmup.py): the model's smallest by default, explicit
`warmup_resolutions` as given, the representative size when compiling."""

from __future__ import annotations

from worldserve.config import GenerationStageConfig
from worldserve.engines.generation.warmup import WarmupPlan
from worldserve.ipc.capabilities import GenerationDefaults
from worldserve.ipc.messages import GenerationParams


class StrideRunner:
    """What the plan reads of a runner: its size and frame strides."""

    size_multiple, temporal_stride = 16, 4

    def snap_frames(self, num_frames: int) -> int:
        return max(1, (num_frames - 1) // self.temporal_stride * self.temporal_stride + 1)

    def check(self, params: GenerationParams) -> None: ...


def _sizes(defaults: GenerationDefaults, **config) -> list[tuple[int, int, int]]:
    plan = WarmupPlan.create(GenerationStageConfig(**config), defaults, StrideRunner())
    return [(p.width, p.height, p.num_frames) for p in plan.requests()]


def test_video_model_warms_at_its_smallest_size_on_the_video_path() -> None:
    assert _sizes(GenerationDefaults(width=1280, height=704, num_frames=93)) == [(16, 16, 5)]


def test_image_model_warms_one_smallest_frame() -> None:
    assert _sizes(GenerationDefaults(width=1024, height=1024, num_frames=1)) == [(16, 16, 1)]


def test_explicit_resolutions_and_compile_keep_their_sizes() -> None:
    defaults = GenerationDefaults(width=1280, height=704, num_frames=93)
    assert _sizes(defaults, warmup_resolutions=["64x32"]) == [(64, 32, 17)]
    assert _sizes(defaults, compile=True) == [(848, 464, 17)]  # area <= 832x480, stride 16
