"""What the generation engine needs from a media-generation runner and an action runner (a
family satisfies them structurally; the engine never imports a family module).

The engine owns queueing, batching, interleaving, progress, cancellation and output files; the
runner owns the model and the tensors of each running batch (the `RunnerBatch` it returns from
`prepare()`). One engine step calls exactly one runner phase.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

from worldserve.ipc.messages import ActionsResult, GenerateActions, GenerationParams
from worldserve.models.types import (
    RowExtras,
    RunnerFeatures,
    StepCacheSettings,
    StepCacheStats,
)


class RunnerBatch(Protocol):
    """The runner's state of one running batch; row r belongs to request `row_owner[r]`."""

    row_owner: list[str]
    step_index: int  # denoising steps done

    @property
    def num_steps(self) -> int: ...

    @property
    def done_denoising(self) -> bool: ...

    def keep_rows(self, keep: list[int]) -> None:
        """Drop every row not in `keep` (a cancelled request leaves the batch)."""


class GenerationRunner(Protocol):
    pipe: Any  # the loaded pipeline (capabilities name its class)
    # Rows one forward can hold: None = no limit of its own (the stage's max_batch_size
    # decides); 1 = no batching, concurrent requests are only interleaved step by step.
    max_batch_size: int | None
    size_multiple: int  # width and height must be multiples of it
    temporal_stride: int  # num_frames must be 1 mod it
    num_params: int
    features: RunnerFeatures  # sound, video conditioning, action generation, ...

    def snap_frames(self, num_frames: int) -> int:
        """The nearest frame count the model can produce (at most `num_frames`)."""

    def check(self, params: GenerationParams) -> None:
        """Raise InvalidRequest (naming the field) for what the model cannot run."""

    def prepare(self, row_owner: list[str], rows: list[GenerationParams],
                seeds: list[int]) -> RunnerBatch:
        """Encode prompts and sample initial latents of one batch (rows share a batch key)."""

    def denoise_step(self, state: Any) -> None:
        """One denoising step of every row of the batch."""

    def decode(self, state: Any, row: int) -> np.ndarray:
        """Frames of one row as floats in [0, 1], (T, H, W, 3)."""

    def extras(self, state: Any, row: int) -> RowExtras | None:
        """A decoded row's sound track and predicted actions (None: frames only)."""


# ---------------------------------------------------------------- optional capabilities
# A runner may also satisfy any of these (checked with isinstance); the admin routes answer
# 501 for what the loaded model's runner does not support.

# One active LoRA selection: ((adapter name, scale), ...); () = the base model.
LoraSelection = tuple[tuple[str, float], ...]


@runtime_checkable
class DescribedRunner(Protocol):
    def describe(self) -> dict[str, Any]:
        """Model facts for GET /admin/model_info: family, pipeline, dtype, device, lora."""


@runtime_checkable
class SpeedRunner(Protocol):
    """Attention backend and compiled blocks (stages.generation.attention_backend / compile),
    applied once after loading; ModelLoadError when this machine cannot run them."""

    def configure_speed(self, attention_backend: str = "native", compile: bool = False,
                        understanding_kv_reuse: bool = False) -> None: ...


@runtime_checkable
class LoraRunner(Protocol):
    """LoRA adapters loaded by name; the engine activates one selection before each phase."""

    def load_lora(self, name: str, path: str, scale: float,
                  path_2: str | None = None) -> dict[str, Any]:
        """Load an adapter (InvalidRequest: missing path, wrong layout; Conflict: name taken);
        `path_2`: the same adapter's file for a second transformer (Wan 2.2 low-noise expert)."""

    def unload_lora(self, name: str) -> None: ...

    def list_lora(self) -> list[dict[str, Any]]:
        """`[{name, path, scale}]` of the loaded adapters."""

    def resolve_lora(self, refs: list[tuple[str, float | None]]) -> LoraSelection:
        """A request's selection with default scales filled in (InvalidRequest: unknown name)."""

    def activate_lora(self, selection: LoraSelection) -> None:
        """Make exactly `selection` active for the next forward (no adapter for ())."""


@runtime_checkable
class StepCacheRunner(Protocol):
    """Step caching per request row (`features.step_cache_methods` names the methods)."""

    def enable_step_cache(self, settings: StepCacheSettings) -> None:
        """Install the cache hooks once, at startup; rows cache when their params ask."""

    def step_cache_stats(self, state: Any, row: int) -> StepCacheStats | None:
        """A row's forwards and skipped forwards (None: the row did not cache)."""


@runtime_checkable
class ChunkedDecodeRunner(Protocol):
    """A runner whose VAE decode can tile and can be spread over several engine steps
    (stages.generation.vae_tiling / vae_decode_chunk_frames)."""

    def configure_vae(self, tiling: bool, tile_size: int | None,
                      tile_stride: int | None) -> dict[str, Any]:
        """Spatial tiling on or off (sizes in output pixels, None: the VAE's own); the
        settings in force, for model_info."""

    def decode_chunk(self, state: Any, row: int, max_frames: int) -> np.ndarray | None:
        """Decode up to `max_frames` more latent frames of `row`: None while frames are left,
        then the row's frames exactly as `decode(state, row)` returns them."""


@runtime_checkable
class YieldingRunner(Protocol):
    """A runner whose forwards can pause between transformer blocks (a colocated stage runs
    the reasoner there: runtime/colocation.py)."""

    def set_yield_point(self, yield_point: Callable[[], None] | None) -> int:
        """Call `yield_point()` before every transformer block of the coming forwards (None:
        remove the hooks); the number of blocks hooked (0: none to hook)."""


@runtime_checkable
class WeightsRunner(Protocol):
    def update_weights(self, path: str) -> dict[str, Any]:
        """Same-architecture weights from a directory; shapes are checked before anything is
        copied (InvalidRequest naming the first mismatching tensor)."""


@runtime_checkable
class OffloadRunner(Protocol):
    def release_memory(self) -> dict[str, Any]:
        """Move the weights off the accelerator (to host memory)."""

    def resume_memory(self) -> dict[str, Any]:
        """Move them back to the device the model was loaded on."""


class ActionRunner(Protocol):
    def metadata(self) -> dict[str, Any]:
        """Action-head facts the api needs (horizon, dims, limits)."""

    def run(self, msg: GenerateActions) -> ActionsResult: ...
