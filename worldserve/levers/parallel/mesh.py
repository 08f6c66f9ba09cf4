"""Which rank does what in a generation rank group.

A group of `world_size` ranks runs each request together. Ranks are laid out as
(replica, cfg, ring, ulysses), ulysses fastest:

    rank = ((replica * cfg + cfg_index) * ring + ring_index) * ulysses + ulysses_index

- cfg: the conditional and unconditional forwards of a step run on the two cfg halves;
- ulysses x ring = the sequence-parallel (sp) group: the generation tokens are split in
  `ulysses * ring` chunks, chunk index = ring_index * ulysses + ulysses_index;
- replica: only when `shard` is larger than cfg x ulysses x ring, the extra ranks repeat the
  same compute so that the weights can be split `shard` ways;
- shard: contiguous blocks of `shard` ranks hold one copy of the transformer blocks' weights
  between them (every rank of a block runs the same block forwards, so the all-gathers pair up).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ParallelLayout:
    """The sizes of each parallel axis (validated by the stage config)."""

    cfg: int = 1
    ulysses: int = 1
    ring: int = 1
    shard: int = 1
    vae: bool = True  # split the VAE decode across every rank (strips with halo exchange)

    @property
    def compute_ranks(self) -> int:
        return self.cfg * self.ulysses * self.ring

    @property
    def world_size(self) -> int:
        return max(self.compute_ranks, self.shard)

    @property
    def replicas(self) -> int:
        return self.world_size // self.compute_ranks

    @property
    def sequence_parallel(self) -> int:
        return self.ulysses * self.ring

    def coords(self, rank: int) -> tuple[int, int, int, int]:
        """(replica, cfg_index, ring_index, ulysses_index) of `rank`."""
        rank, ulysses_index = divmod(rank, self.ulysses)
        rank, ring_index = divmod(rank, self.ring)
        replica, cfg_index = divmod(rank, self.cfg)
        return replica, cfg_index, ring_index, ulysses_index

    def rank_of(self, replica: int, cfg_index: int, ring_index: int, ulysses_index: int) -> int:
        return ((replica * self.cfg + cfg_index) * self.ring + ring_index) * self.ulysses \
            + ulysses_index

    def groups(self, axis: str) -> list[list[int]]:
        """Every group of `axis` (sp | ulysses | ring | cfg | shard | world), ranks ascending."""
        ranks = range(self.world_size)
        if axis == "world":
            return [list(ranks)]
        if axis == "shard":
            return [list(range(s, s + self.shard)) for s in range(0, self.world_size, self.shard)]
        keep = {"sp": (0, 1), "ulysses": (0, 1, 2), "ring": (0, 1, 3), "cfg": (0, 2, 3)}[axis]
        out: dict[tuple[int, ...], list[int]] = {}
        for rank in ranks:
            coords = self.coords(rank)
            out.setdefault(tuple(coords[i] for i in keep), []).append(rank)
        return list(out.values())

    def describe(self) -> str:
        return (f"cfg={self.cfg},ulysses={self.ulysses},ring={self.ring},shard={self.shard}"
                f" ({self.world_size} ranks)")


AXES = ("world", "sp", "ulysses", "ring", "cfg", "shard")


@dataclass
class GroupHandle:
    """One process group as this rank sees it: the torch group (None when it is just this
    rank), its ranks in axis order and this rank's position among them."""

    ranks: list[int]
    index: int
    group: Any = None
    timeout_s: float = 300.0  # every collective of the group fails after this long

    @property
    def size(self) -> int:
        return len(self.ranks)


@dataclass
class RankMesh:
    """This rank's process groups along every axis. `build()` creates them (every rank calls
    it, in the same order, right after `init_process_group`); a group restart builds them
    again on the same object, so everything holding the mesh sees the new groups."""

    layout: ParallelLayout
    rank: int
    handles: dict[str, GroupHandle] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for axis in AXES:  # positions are known before any group exists (loading needs them)
            ranks = next(g for g in self.layout.groups(axis) if self.rank in g)
            self.handles[axis] = GroupHandle(ranks=ranks, index=ranks.index(self.rank))

    def build(self, timeout_s: float) -> None:
        """`timeout_s` bounds every collective of the new groups (`new_group` would otherwise
        take torch's 30-minute default, not the world group's)."""
        import datetime

        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=timeout_s)
        everyone = list(range(self.layout.world_size))
        for axis in AXES:
            handle = self.handles[axis]
            handle.group, handle.timeout_s = None, timeout_s
            for ranks in self.layout.groups(axis):
                if len(ranks) < 2:
                    continue
                group = (dist.group.WORLD if ranks == everyone
                         else dist.new_group(ranks, timeout=timeout))
                if self.rank in ranks:
                    handle.group = group

    @property
    def world(self) -> GroupHandle:
        return self.handles["world"]

    @property
    def sp(self) -> GroupHandle:
        return self.handles["sp"]

    @property
    def ulysses(self) -> GroupHandle:
        return self.handles["ulysses"]

    @property
    def ring(self) -> GroupHandle:
        return self.handles["ring"]

    @property
    def cfg(self) -> GroupHandle:
        return self.handles["cfg"]

    @property
    def shard(self) -> GroupHandle:
        return self.handles["shard"]
