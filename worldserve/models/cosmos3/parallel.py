"""A Cosmos3 runner that is one rank of a generation rank group (`stages.generation.parallel`).

Every rank loads the pipeline and runs the same phases in lockstep (rank 0 for the engine,
peers on rank 0's commands: ranks/group.py); what each rank computes differs only inside a
denoising step and a decode:

- cfg = 2: the cfg half with index 0 runs the cond forward, index 1 the uncond forward; both
  exchange their velocities and combine them identically (`_guided_velocities`);
- ulysses / ring: the transformer's generation tokens are split across the sp group
  (parallel_attention.py);
- shard: the decoder blocks' weights are split across the shard group (levers/parallel/shard.py),
  read straight from the checkpoint so no rank holds the whole generator (parallel_load.py);
- vae: the VAE decode is split by latent rows across all ranks (parallel_vae.py).

`prepare` has no collective: each rank derives the same noise, tokens and conditioning from
the request (a CPU generator seeded per row), so rank 0 may refuse a request alone.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from worldserve.errors import NotSupported
from worldserve.levers.parallel.comm import all_gather
from worldserve.levers.parallel.mesh import ParallelLayout, RankMesh
from worldserve.levers.parallel.shard import ShardedBlocks
from worldserve.models.cosmos3 import checks
from worldserve.models.cosmos3.parallel_attention import Cosmos3SequenceParallel
from worldserve.models.cosmos3.parallel_load import load_sharded_pipeline
from worldserve.models.cosmos3.parallel_vae import can_split, decode_strips
from worldserve.models.cosmos3.runner import Cosmos3Runner
from worldserve.models.cosmos3.state import RowState


def load_rank_runner(model_dir: Path, *, rank: int, layout: ParallelLayout,
                     dtype: str = "float32", device: str = "cpu",
                     safety_checker: bool = False) -> ParallelCosmos3Runner:
    """The registry's `generation_ranks` loader: rank `rank`'s runner (its process groups are
    created later by `connect_ranks`, once every rank has joined)."""
    from worldserve.models.cosmos3.loader import load_pipeline

    mesh = RankMesh(layout, rank)
    if layout.shard > 1:
        pipe, shards = load_sharded_pipeline(model_dir, dtype, device, mesh.shard,
                                             safety_checker=safety_checker)
    else:
        pipe = load_pipeline(model_dir, dtype, device, safety_checker=safety_checker)
        shards = None
    return ParallelCosmos3Runner(pipe, Path(model_dir), mesh, shards)


class ParallelCosmos3Runner(Cosmos3Runner):
    """`Cosmos3Runner` with the cfg / sequence / weight / decode splits of its rank."""

    def __init__(self, pipe: Any, model_dir: Path | None, mesh: RankMesh,
                 shards: ShardedBlocks | None = None) -> None:
        super().__init__(pipe, model_dir)
        self.mesh = mesh
        self.layout = mesh.layout
        self.shards = shards
        # No step caching across ranks: each rank's hooks would decide on its own slice of the
        # sequence, so ranks could disagree on skipping a forward (a hung collective).
        self.features = dataclasses.replace(self.features, step_cache_methods=())
        self.declaration = checks.declaration(self)
        if shards is not None:  # the placeholders count 0: add the blocks' real size
            self.num_params += shards.num_params
        self.sequence = None
        if self.layout.sequence_parallel > 1:
            self._check_heads()
            self.sequence = Cosmos3SequenceParallel(mesh)
            self.sequence.install(pipe.transformer)

    def connect_ranks(self, timeout_s: float) -> None:
        """Create this rank's process groups (every rank, same order, after the group's
        `init_process_group`; again after a group restart), their collectives bounded by
        `timeout_s`."""
        self.mesh.build(timeout_s)

    def _check_heads(self) -> None:
        heads = int(self.pipe.transformer.config.num_attention_heads)
        if heads % self.layout.ulysses:
            raise ValueError(f"parallel.ulysses={self.layout.ulysses} must divide the "
                             f"transformer's {heads} attention heads (use ring for the rest)")

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info["parallel"] = {"layout": self.layout.describe(), "rank": self.mesh.rank,
                            "shards": self.shards.describe() if self.shards else None}
        return info

    def update_weights(self, path: str) -> dict[str, Any]:
        if self.shards is not None:
            raise NotSupported("updating weights in place is not supported with sharded "
                               "weights (stages.generation.parallel.shard > 1); restart the "
                               "server on the new checkpoint")
        return super().update_weights(path)

    def _guided_velocities(self, row: RowState, tokens: dict[str, Any], i: int, sigma: float,
                           cfg: bool) -> tuple[list[Any], list[Any] | None]:
        group = self.mesh.cfg
        if not cfg or group.size == 1:
            return super()._guided_velocities(row, tokens, i, sigma, cfg)
        packed, name = (row.cond, "cond") if group.index == 0 else (row.uncond, "uncond")
        mine = self._velocities(row, packed, tokens, i, sigma, name)
        present = [v for v in mine if v is not None]
        flat = torch.cat([v.flatten() for v in present])
        both = all_gather(flat, group)  # (2, n): cond from index 0, uncond from index 1
        return _unflatten(both[0], mine), _unflatten(both[1], mine)

    def decode_in_group(self, state: Any, row: int) -> bool:
        """Whether decoding `row` needs every rank (else rank 0 decodes alone)."""
        return self.layout.vae and can_split(state.rows[row].latents.shape[-2], self.mesh.world)

    def _vae_decode(self, z_raw: torch.Tensor) -> torch.Tensor:
        world = self.mesh.world
        if self.layout.vae and can_split(z_raw.shape[3], world):
            return decode_strips(self.pipe.vae, z_raw, world)
        return super()._vae_decode(z_raw)


def _unflatten(flat: torch.Tensor, like: list[Any]) -> list[Any]:
    """`flat` cut back into tensors shaped as the non-None entries of `like`."""
    out: list[Any] = []
    offset = 0
    for tensor in like:
        if tensor is None:
            out.append(None)
            continue
        out.append(flat[offset:offset + tensor.numel()].view_as(tensor))
        offset += tensor.numel()
    return out
