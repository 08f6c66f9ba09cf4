"""What a Cosmos3 request carries between its phases: one `RowState` per output row (one
`__call__`'s locals) and the `Cosmos3Batch` of one request's rows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from worldserve.levers.step_cache import StepCacheRow
from worldserve.models.types import RowExtras
from worldserve.models.wan.vae import WanDecodeJob


@dataclass
class RowState:
    """Everything one output row needs between steps (one `__call__`'s locals)."""

    latents: torch.Tensor
    sound_latents: torch.Tensor | None
    action_latents: torch.Tensor | None
    cond: dict[str, Any]
    uncond: dict[str, Any]
    vision_mask: torch.Tensor
    sound_mask: torch.Tensor | None
    action_mask: torch.Tensor | None
    action_domain_id: int | None
    raw_action_dim: int | None
    action_mode: str | None
    scheduler: Any
    sound_scheduler: Any
    action_scheduler: Any
    timesteps: torch.Tensor
    # the same values read once to the host (prepare): a forward's timestep tensors are filled
    # from them, with no per-forward device-to-host sync (`t.item()` of before)
    host_timesteps: list[float]
    # whether any action is noisy (the mask is fixed for the row): the action scheduler steps
    noisy_action: bool
    mixed_precision: Any
    device: Any  # the pipeline's execution device, resolved once per row
    decode_job: WanDecodeJob | None = None  # a chunked VAE decode under way (decode_chunk)
    # "cond" / "uncond" -> that prompt's recorded understanding K/V (models/cosmos3/kv_reuse.py)
    understanding_kv: dict[str, Any] = field(default_factory=dict)
    # step caching (levers/step_cache.py): this row's context names, whether it caches, and
    # its transformer forwards so far
    cache: StepCacheRow = field(default_factory=StepCacheRow)


@dataclass
class Cosmos3Batch:
    """The rows of one request (one row per seed); every row advances once per step."""

    row_owner: list[str]
    rows: list[RowState]
    guidance_scale: float
    step_index: int = 0
    num_timesteps: int = 0
    extras_cache: dict[int, RowExtras] = field(default_factory=dict)
    # frees a row's step-cache state (finished or cancelled rows); None: no step cache
    release: Callable[[RowState], None] | None = None

    @property
    def num_steps(self) -> int:
        return self.num_timesteps

    @property
    def done_denoising(self) -> bool:
        return self.step_index >= self.num_timesteps

    def keep_rows(self, keep: list[int]) -> None:
        if self.release is not None:
            for i, row in enumerate(self.rows):
                if i not in keep:
                    self.release(row)
        self.row_owner = [self.row_owner[i] for i in keep]
        self.rows = [self.rows[i] for i in keep]
