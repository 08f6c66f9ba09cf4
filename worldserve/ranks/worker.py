"""A peer rank of a generation rank group (started by rank 0: ranks/group.py).

`python -m worldserve.ranks.worker --launch FILE`: load the model for this rank, tell
rank 0 it is ready, join the process group, then run each command rank 0 sends and answer
`RankDone` (with the error's first line when it failed) until `Shutdown`. The kernel stops
the process when rank 0 (its parent) dies.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any, Callable

import msgspec
import zmq

from worldserve.ranks.group import RANKS_KIND, peer_identity
from worldserve.ranks.messages import (
    ActivateLora,
    DecodeRow,
    DenoiseStep,
    KeepRows,
    LoadLora,
    PrepareBatch,
    RankCodec,
    RankCommand,
    RankDone,
    RankLaunch,
    RankReady,
    ReleaseMemory,
    ResumeMemory,
    Shutdown,
    UnloadLora,
    UpdateWeights,
)

log = logging.getLogger("worldserve.ranks")
PR_SET_PDEATHSIG = 1


class PeerRank:
    """Runs rank 0's commands on this rank's runner; holds the batches by id."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.batches: dict[int, Any] = {}
        self.running = True
        self._handlers: dict[type, Callable[[Any], None]] = {
            PrepareBatch: self._prepare, DenoiseStep: self._denoise, DecodeRow: self._decode,
            KeepRows: self._keep, ActivateLora: self._activate, LoadLora: self._load_lora,
            UnloadLora: lambda c: runner.unload_lora(c.name),
            UpdateWeights: lambda c: runner.update_weights(c.path),
            ReleaseMemory: lambda c: runner.release_memory(),
            ResumeMemory: lambda c: runner.resume_memory(), Shutdown: self._shutdown}

    def handle(self, command: RankCommand) -> str | None:
        """Run one command; its error's first line, or None."""
        for batch_id in command.drop_batches:
            self.batches.pop(batch_id, None)
        try:
            self._handlers[type(command)](command)
        except Exception as exc:  # reported to rank 0, which decides what the group does
            log.warning("command %s failed: %s", type(command).__name__, exc)
            return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return None

    def _batch(self, batch_id: int) -> Any:
        if batch_id not in self.batches:
            raise KeyError(f"no batch {batch_id} on this rank")
        return self.batches[batch_id]

    def _prepare(self, c: PrepareBatch) -> None:
        self.batches[c.batch_id] = self.runner.prepare(c.row_owner, c.rows, c.seeds)

    def _denoise(self, c: DenoiseStep) -> None:
        self.runner.denoise_step(self._batch(c.batch_id))

    def _decode(self, c: DecodeRow) -> None:
        self.runner.decode(self._batch(c.batch_id), c.row)

    def _keep(self, c: KeepRows) -> None:
        self._batch(c.batch_id).keep_rows(c.keep)

    def _activate(self, c: ActivateLora) -> None:
        self.runner.activate_lora(tuple((name, scale) for name, scale in c.selection))

    def _load_lora(self, c: LoadLora) -> None:
        self.runner.load_lora(c.name, c.path, c.scale, c.path_2)

    def _shutdown(self, c: Shutdown) -> None:
        self.running = False


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def _load(launch: RankLaunch) -> Any:
    import torch

    from worldserve.levers.parallel.mesh import ParallelLayout
    from worldserve.models import registry

    torch.set_num_threads(launch.torch_threads)
    if launch.device.startswith("cuda"):
        torch.cuda.set_device(launch.device)
    return registry.load_runner(
        RANKS_KIND, Path(launch.model_dir), rank=launch.rank,
        layout=ParallelLayout(**launch.layout),  # type: ignore[arg-type]
        dtype=launch.dtype, device=launch.device, safety_checker=False)


def _join(launch: RankLaunch) -> None:
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=launch.timeout_s)
    store = dist.TCPStore("127.0.0.1", launch.store_port, launch.world_size, is_master=False,
                          timeout=timeout)
    dist.init_process_group(launch.backend, store=store, rank=launch.rank,
                            world_size=launch.world_size, timeout=timeout)


def serve(launch: RankLaunch) -> None:
    runner = _load(launch)
    codec = RankCodec()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IDENTITY, peer_identity(launch.rank))
    sock.connect(launch.command_address)
    sock.send(codec.encode(RankReady(rank=launch.rank, pid=os.getpid())))
    _join(launch)
    runner.connect_ranks(launch.timeout_s)
    peer = PeerRank(runner)
    while peer.running:
        command = codec.decode_command(sock.recv())
        error = peer.handle(command)
        sock.send(codec.encode(RankDone(seq=command.seq, rank=launch.rank, error=error)))
    sock.close(0)
    ctx.term()


def main(argv: list[str] | None = None) -> int:
    _die_with_parent()
    parser = argparse.ArgumentParser(prog="worldserve-rank")
    parser.add_argument("--launch", required=True, type=Path)
    args = parser.parse_args(argv)
    launch = msgspec.json.decode(args.launch.read_bytes(), type=RankLaunch)
    logging.basicConfig(
        level=launch.log_level.upper(),
        format=f"%(asctime)s %(levelname)s [generation rank {launch.rank}] %(name)s: "
               "%(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the api process owns Ctrl+C
    try:
        serve(launch)
    except Exception as exc:
        print(f"generation rank {launch.rank} failed: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
