"""The generation runner the engine sees when its stage is a rank group: each phase it is
asked to run is sent to every peer rank first (ranks/messages.py), then run by rank 0's own
runner (whose collectives pair with the peers'), then confirmed by every peer. The engine's
stepping, interleaving, progress, cancellation, LoRA and admin code stays as it is.

State kept so that a restarted group can catch up: the LoRA adapters loaded and the
weights updated since start (replayed to new peers in order), the active LoRA selection and
whether the weights are released.
"""

from __future__ import annotations

import atexit
import logging
import os
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from worldserve.config import GenerationStageConfig
from worldserve.errors import NotSupported
from worldserve.models import registry
from worldserve.ranks.group import (
    RANKS_KIND,
    GroupSpec,
    RankGroup,
    RankGroupError,
    layout_fields,
    rank_devices,
)
from worldserve.ranks.messages import (
    ActivateLora,
    DecodeRow,
    DenoiseStep,
    KeepRows,
    LoadLora,
    PrepareBatch,
    RankCommand,
    ReleaseMemory,
    ResumeMemory,
    UnloadLora,
    UpdateWeights,
)

log = logging.getLogger("worldserve.ranks")
T = TypeVar("T")
# A collective fails the moment a peer's socket closes; its process may take a moment more to
# be reaped. This long the failure waits to name the dead rank instead of the socket error.
DEATH_GRACE_S = 1.0
# When rank 0 fails a phase on its own, this long its peers may take to finish theirs.
PEER_GRACE_S = 2.0


class GroupBatch:
    """A running batch of the group: rank 0's runner state plus the id the peers know it by.
    When the engine lets go of it, the peers drop their copy with the next command."""

    def __init__(self, runner: RankGroupRunner, batch_id: int, epoch: int, local: Any) -> None:
        self.runner = runner
        self.batch_id = batch_id
        self.epoch = epoch
        self.local = local
        weakref.finalize(self, runner.dropped.append, batch_id)

    @property
    def row_owner(self) -> list[str]:
        return self.local.row_owner

    @property
    def step_index(self) -> int:
        return self.local.step_index

    @property
    def num_steps(self) -> int:
        return self.local.num_steps

    @property
    def done_denoising(self) -> bool:
        return self.local.done_denoising

    def keep_rows(self, keep: list[int]) -> None:
        self.runner.keep_rows(self, keep)


class RankGroupRunner:
    """Rank 0's runner facade over the group (the generation runner contract and its optional
    LoRA / weights / memory capabilities)."""

    def __init__(self, local: Any, group: RankGroup) -> None:
        self.local = local
        self.group = group
        self.pipe = local.pipe
        self.max_batch_size = local.max_batch_size
        self.size_multiple = local.size_multiple
        self.temporal_stride = local.temporal_stride
        self.num_params = local.num_params
        self.features = local.features
        self.dropped: list[int] = []
        self._next_batch = 0
        # The LoRA selection active on rank 0, and the one the peers hold (None: unknown, as
        # loading an adapter activates it: the next activation is sent whatever it is).
        self._active: tuple[tuple[str, float], ...] = ()
        self._selection: tuple[tuple[str, float], ...] | None = ()
        self._replay: list[RankCommand] = []
        self._released = False

    # ------------------------------------------------------------------ contract

    def snap_frames(self, num_frames: int) -> int:
        return self.local.snap_frames(num_frames)

    def check(self, params: Any) -> None:
        self.local.check(params)

    def describe(self) -> dict[str, Any]:
        info = dict(self.local.describe()) if hasattr(self.local, "describe") else {}
        info["rank_group"] = {"epoch": self.group.epoch, "ready": self.group.ready,
                              "world_size": self.group.spec.world_size,
                              "backend": self.group.spec.backend,
                              "devices": self.group.spec.devices,
                              "pids": {str(r): p for r, p in self.group.pids().items()}}
        return info

    def prepare(self, row_owner: list[str], rows: list[Any], seeds: list[int]) -> GroupBatch:
        """A new batch on every rank. A group found broken meanwhile (a peer that died while
        idle, or while this batch was prepared: prepare has no collective, so no rank is left
        mid-way) costs this batch nothing: it is prepared again on the restarted group."""
        try:
            return self._prepare(row_owner, rows, seeds)
        except RankGroupError as exc:
            log.warning("preparing again on a restarted rank group (%s)", exc)
            return self._prepare(row_owner, rows, seeds)

    def _prepare(self, row_owner: list[str], rows: list[Any], seeds: list[int]) -> GroupBatch:
        self._ensure_ready()
        self._next_batch += 1
        batch_id = self._next_batch
        command = PrepareBatch(seq=0, batch_id=batch_id, row_owner=row_owner, rows=rows,
                               seeds=seeds)
        try:  # no collective in prepare: rank 0 may refuse a request the peers accepted
            local = self._run(command, lambda: self.local.prepare(row_owner, rows, seeds),
                              "preparing a batch", collective=False)
        except Exception:
            self.dropped.append(batch_id)
            raise
        return GroupBatch(self, batch_id, self.group.epoch, local)

    def denoise_step(self, state: GroupBatch) -> None:
        self._check_batch(state)
        what = f"denoising step {state.step_index + 1}"
        self._run(DenoiseStep(seq=0, batch_id=state.batch_id),
                  lambda: self.local.denoise_step(state.local), what)

    def decode(self, state: GroupBatch, row: int) -> Any:
        self._check_batch(state)
        in_group = getattr(self.local, "decode_in_group", None)
        if in_group is None or not in_group(state.local, row):
            return self.local.decode(state.local, row)
        return self._run(DecodeRow(seq=0, batch_id=state.batch_id, row=row),
                         lambda: self.local.decode(state.local, row), "decoding")

    def extras(self, state: GroupBatch, row: int) -> Any:
        return self.local.extras(state.local, row)  # sound and actions: rank 0 alone

    def keep_rows(self, state: GroupBatch, keep: list[int]) -> None:
        state.local.keep_rows(keep)
        if state.epoch == self.group.epoch and self.group.ready:
            self._run(KeepRows(seq=0, batch_id=state.batch_id, keep=keep), lambda: None,
                      "dropping rows", collective=False)

    # ------------------------------------------------------------------ admin

    def load_lora(self, name: str, path: str, scale: float,
                  path_2: str | None = None) -> dict[str, Any]:
        self._ensure_ready()
        result = self.local.load_lora(name, path, scale, path_2)  # refuses bad input alone
        self._change(LoadLora(seq=0, name=name, path=path, scale=scale, path_2=path_2),
                     "loading a LoRA adapter")
        return result

    def unload_lora(self, name: str) -> None:
        self.local.unload_lora(name)
        self._change(UnloadLora(seq=0, name=name), "unloading a LoRA adapter")
        # what a later epoch replays: the adapters still loaded (the load order kept)
        self._replay = [c for c in self._replay
                        if not (isinstance(c, (LoadLora, UnloadLora)) and c.name == name)]

    def list_lora(self) -> list[dict[str, Any]]:
        return self.local.list_lora()

    def resolve_lora(self, refs: list[tuple[str, float | None]]) -> Any:
        return self.local.resolve_lora(refs)

    def activate_lora(self, selection: Any) -> None:
        self.local.activate_lora(selection)
        self._active = tuple((name, float(scale)) for name, scale in selection)
        if self.group.ready:  # else a new group's peers get it as they join
            self._sync_selection("activating LoRA adapters")

    def _sync_selection(self, what: str) -> None:
        if self._active != self._selection:
            self._run(ActivateLora(seq=0, selection=list(self._active)), lambda: None, what,
                      collective=False)
            self._selection = self._active

    def update_weights(self, path: str) -> dict[str, Any]:
        if not hasattr(self.local, "update_weights"):
            raise NotSupported("this model's runner cannot update weights in place")
        result = self.local.update_weights(path)
        self._replay = [c for c in self._replay if not isinstance(c, UpdateWeights)]
        self._change(UpdateWeights(seq=0, path=path), "updating weights")  # the latest wins
        return result

    def release_memory(self) -> dict[str, Any]:
        result = self.local.release_memory()
        self._released = True
        self._run(ReleaseMemory(seq=0), lambda: None, "releasing memory", collective=False)
        return result

    def resume_memory(self) -> dict[str, Any]:
        result = self.local.resume_memory()
        self._released = False
        self._run(ResumeMemory(seq=0), lambda: None, "resuming memory", collective=False)
        return result

    def _change(self, command: RankCommand, what: str) -> None:
        """A state change every rank must make; remembered for peers of a later epoch."""
        self._replay.append(command)
        self._selection = None
        self._run(command, lambda: None, what, collective=False)

    # ------------------------------------------------------------------ group

    def _run(self, command: RankCommand, local: Callable[[], T], what: str, *,
             collective: bool = True) -> T:
        """Peers first, rank 0 second, then every peer's answer. When rank 0 fails a phase
        with collectives, its peers either finished it (they answer within PEER_GRACE_S: rank
        0 failed after the last collective) or wait in a collective: the group restarts."""
        if not self.group.ready:
            self._ensure_ready()
        command.drop_batches, self.dropped[:] = list(self.dropped), []
        seq = self._send(command, what)
        try:
            result = local()
        except Exception as exc:
            if not collective:
                self._wait(seq, what)
            elif not self._peers_finish(seq, exc):
                self._broken(f"rank 0 failed: {_first_line(exc)}", what, cause=exc)
            raise
        errors = {rank: err for rank, err in self._wait(seq, what).items() if err}
        if errors:
            rank, error = min(errors.items())
            self._broken(f"rank {rank} failed: {error}", what)
        return result

    def _peers_finish(self, seq: int, exc: Exception) -> bool:
        """After rank 0 failed a phase with collectives: did every peer finish it anyway (rank 0
        failed after the last collective, e.g. in post-processing)? A peer left waiting in a
        collective does not answer within the grace: the group has to restart."""
        if _is_collective_error(exc):
            return False
        try:
            self.group.wait_done(seq, timeout_s=PEER_GRACE_S)
        except RankGroupError:
            return False
        return True

    def _send(self, command: RankCommand, what: str) -> int:
        try:
            return self.group.send(command)
        except RankGroupError as exc:
            self._broken(str(exc), what)
            raise  # unreachable: _broken raises

    def _wait(self, seq: int, what: str) -> dict[int, str | None]:
        try:
            return self.group.wait_done(seq)
        except RankGroupError as exc:
            self._broken(str(exc), what)
            raise  # unreachable

    def _broken(self, reason: str, what: str, cause: Exception | None = None) -> None:
        """Restart the group and fail the current request (its peers' state is gone). A
        collective that failed because a peer died names the peer and how it ended."""
        dead = self.group.wait_for_dead_peer(DEATH_GRACE_S)
        if dead is not None:
            reason = dead
        self.group.restart(reason)
        if cause is not None and not _is_collective_error(cause):
            raise cause
        raise RankGroupError(f"the generation rank group failed while {what}: {reason}; the "
                             f"group is restarting, submit the request again")

    def _check_batch(self, state: GroupBatch) -> None:
        dead = self.group.dead_peer() if self.group.ready else None
        if dead is not None:
            self.group.restart(f"{dead} between steps")
        if state.epoch != self.group.epoch:
            raise RankGroupError(f"the generation rank group restarted after "
                                 f"{dead or 'a rank failed'}; this request's progress was lost, "
                                 f"submit it again")

    def _ensure_ready(self) -> None:
        """Join a (re)started group and bring its peers to rank 0's state."""
        if self.group.ready:
            dead = self.group.dead_peer()
            if dead is None:
                return
            self.group.restart(f"{dead} while idle")
        try:
            self.group.join()
            self.local.connect_ranks(self.group.spec.timeout_s)
        except Exception as exc:  # a group that cannot come back takes the stage down
            log.critical("the generation rank group cannot start again: %s; stopping the "
                         "stage", exc)
            os._exit(1)
        self._selection = ()  # fresh peers: no adapter
        for command in self._replay:
            self._run(command, lambda: None, "catching up", collective=False)
            self._selection = None  # loading activates the new adapter
        self._sync_selection("catching up")
        if self._released:
            self._run(ReleaseMemory(seq=0), lambda: None, "catching up", collective=False)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _is_collective_error(exc: Exception) -> bool:
    from worldserve.levers.parallel.comm import CollectiveError

    return isinstance(exc, CollectiveError)


# ---------------------------------------------------------------------- start


def start_rank_runner(config: GenerationStageConfig, model_dir: Path,
                      log_level: str = "info") -> RankGroupRunner:
    """Start the peers, load rank 0's runner meanwhile, join the group."""
    from worldserve.levers.parallel.mesh import ParallelLayout

    _check_family(config, model_dir)
    layout = layout_fields(config.parallel)
    spec = _group_spec(config, model_dir, layout, log_level)
    group = RankGroup(spec)
    atexit.register(group.close)
    group.spawn()
    local = registry.load_runner(RANKS_KIND, model_dir, rank=0,
                                 layout=ParallelLayout(**layout),  # type: ignore[arg-type]
                                 dtype=config.dtype, device=spec.devices[0],
                                 safety_checker=config.safety_checker)
    group.join()
    local.connect_ranks(spec.timeout_s)
    return RankGroupRunner(local, group)


def _check_family(config: GenerationStageConfig, model_dir: Path) -> None:
    family = registry.resolve("generation", model_dir)
    if RANKS_KIND not in family.loaders:
        raise ValueError(f"stages.generation.parallel asks for {config.parallel.world_size} "
                         f"ranks but {model_dir} is a {family.name} model; rank groups run "
                         f"{', '.join(registry.supported(RANKS_KIND))} models")


def _group_spec(config: GenerationStageConfig, model_dir: Path,
                layout: dict[str, int | bool], log_level: str) -> GroupSpec:
    import torch

    from worldserve import envs

    world = config.parallel.world_size
    return GroupSpec(model_dir=model_dir, dtype=config.dtype,
                     devices=rank_devices(config.device, world), layout=layout,
                     world_size=world, timeout_s=config.parallel.timeout_s,
                     start_timeout_s=config.start_timeout_s, log_level=log_level,
                     torch_threads=envs.torch_num_threads() or torch.get_num_threads())
