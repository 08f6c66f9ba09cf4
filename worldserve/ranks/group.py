"""A generation stage that is a group of ranks: rank 0 is the stage process itself (engine,
scheduler, socket to the api); it starts ranks 1..N-1 as child processes, one device each,
joins them in one `torch.distributed` process group (gloo on CPU, NCCL on CUDA) and tells
them, phase by phase, what to run (ranks/messages.py commands over a ZeroMQ socket in a private
folder). The engine sees one runner (ranks/runner.py); this module owns the processes.

Failure: a peer that exits, a collective that fails (the group has a timeout:
`parallel.timeout_s`) or a peer that does not answer within that timeout breaks the group.
Rank 0 then fails the request it was running (stage_unavailable, naming the rank and how it
ended), kills the other peers and starts a fresh set (`epoch` + 1); batches of the old epoch
fail at their next phase, new requests wait for the new group. A group that cannot start
again takes the stage down (the process exits; the supervisor answers 503 for it). If rank 0
dies, its peers get SIGTERM from the kernel (PR_SET_PDEATHSIG) and the supervisor sees the
stage die as for any stage.

On NCCL a collective does not fail when a peer dies: it is only enqueued, and rank 0 blocks
at its next host sync inside its own phase, where nothing polls the peers. So on NCCL rank 0
runs a `PeerWatch` thread that aborts the process group as soon as a peer process exits (the
blocked call then raises and the group restarts as above), and every rank runs with
`TORCH_NCCL_ASYNC_ERROR_HANDLING=2` (abort the communicators on a watchdog timeout, keep the
process: a hung peer fails the request after `parallel.timeout_s` instead of killing the
stage). Unverified on a GPU (docs/parallel.md).

Why rank 0 spawns its peers (rather than the supervisor): the group then lives and dies
with the stage process the supervisor already watches, a restart needs no supervisor
protocol, and `--cluster ray` replicas (which create engines themselves) get groups too.
"""

from __future__ import annotations

import datetime
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import zmq

import worldserve
from worldserve import envs
from worldserve.errors import StageUnavailable
from worldserve.ranks.messages import (
    RankCodec,
    RankCommand,
    RankDone,
    RankLaunch,
    RankReady,
    Shutdown,
)
from worldserve.runtime.supervisor import describe_exit

log = logging.getLogger("worldserve.ranks")

RANKS_KIND = "generation_ranks"  # the registry's loader kind for one rank of a group
POLL_MS = 50
KILL_GRACE_S = 5.0
WATCH_PERIOD_S = 0.1
# torch's NCCL error handling: 2 = CleanUpOnly (abort the communicators, raise, keep the
# process), so a watchdog timeout fails the request and the group restarts.
NCCL_ERROR_HANDLING = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}


class PeerWatch:
    """A thread that calls `abort()` once when any of `peers` (processes) exits; `stop()`
    ends it without aborting."""

    def __init__(self, peers: dict[int, subprocess.Popen[bytes]], abort: Any,
                 period_s: float = WATCH_PERIOD_S) -> None:
        self.peers = dict(peers)
        self.abort = abort
        self.period_s = period_s
        self.fired: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="rank-peer-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(self.period_s):
            for rank, proc in self.peers.items():
                if proc.poll() is not None:
                    self.fired = f"rank {rank} {describe_exit(proc.returncode)}"
                    log.error("%s: aborting the NCCL process group", self.fired)
                    self.abort()
                    return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def abort_process_groups() -> None:
    """Abort every NCCL communicator of this process: a collective blocked on a dead peer
    raises instead of waiting for the watchdog (torch's own abort, private in torch 2.13)."""
    from torch.distributed.distributed_c10d import _abort_process_group

    _abort_process_group()


class RankGroupError(StageUnavailable):
    """The rank group broke (a rank died, hung or failed a collective); it is restarting."""


def rank_devices(device: str, world_size: int) -> list[str]:
    """One device per rank: `cpu` for all on CPU; on CUDA consecutive visible devices from the
    configured one (`cuda` = `cuda:0`; the placement plan sets the stage process's
    CUDA_VISIBLE_DEVICES, so these are the stage's own devices)."""
    import torch

    if device == "auto":  # normally resolved by the placement plan before the stage starts
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if not device.startswith("cuda"):
        return [device] * world_size
    first = int(device.partition(":")[2] or 0)
    count = torch.cuda.device_count()
    if count < first + world_size:
        raise ValueError(f"stages.generation.parallel needs {world_size} GPUs from {device} "
                         f"on (one per rank); this stage sees {count}")
    return [f"cuda:{first + i}" for i in range(world_size)]


@dataclass
class GroupSpec:
    """What every rank of the group is started with."""

    model_dir: Path
    dtype: str
    devices: list[str]
    layout: dict[str, int | bool]
    world_size: int
    timeout_s: float
    start_timeout_s: float
    log_level: str = "info"
    torch_threads: int = 1
    backend: str = field(init=False)

    def __post_init__(self) -> None:
        self.backend = "nccl" if self.devices[0].startswith("cuda") else "gloo"


class RankGroup:
    """Rank 0's side of the group: the peers' processes, the command socket and the process
    group. Not thread-safe: the stage's one loop thread calls it."""

    def __init__(self, spec: GroupSpec) -> None:
        self.spec = spec
        self.epoch = 0
        self.seq = 0
        self.ready = False
        self._closed = False
        self.peers: dict[int, subprocess.Popen[bytes]] = {}
        self._watch: PeerWatch | None = None
        self._store: Any = None
        self._codec = RankCodec()
        self.run_dir = Path(tempfile.mkdtemp(prefix="worldserve-ranks-",
                                             dir=envs.run_dir_root()))
        self.address = f"ipc://{self.run_dir / 'ranks.sock'}"
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a vanished peer is an error, not a drop
        self._sock.bind(self.address)

    # ------------------------------------------------------------------ lifecycle

    def spawn(self) -> None:
        """Start every peer (they load their model while rank 0 does); `join()` waits."""
        import torch.distributed as dist

        self._store = dist.TCPStore("127.0.0.1", 0, self.spec.world_size, is_master=True,
                                    wait_for_workers=False,
                                    timeout=datetime.timedelta(seconds=self.spec.start_timeout_s))
        for rank in range(1, self.spec.world_size):
            self.peers[rank] = self._spawn_peer(rank, self._store.port)
        log.info("rank group epoch %d: started ranks %s (%s)", self.epoch,
                 {r: p.pid for r, p in self.peers.items()}, self.spec.backend)

    def _spawn_peer(self, rank: int, store_port: int) -> subprocess.Popen[bytes]:
        spec = self.spec
        launch = RankLaunch(
            rank=rank, world_size=spec.world_size, model_dir=str(spec.model_dir),
            dtype=spec.dtype, device=spec.devices[rank], layout=spec.layout,
            backend=spec.backend, store_port=store_port, command_address=self.address,
            timeout_s=spec.timeout_s, torch_threads=spec.torch_threads,
            log_level=spec.log_level)
        path = self.run_dir / f"rank{rank}.json"
        path.write_bytes(msgspec.json.encode(launch))
        env = dict(os.environ)
        package_root = str(Path(worldserve.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # ranks share one host: loopback only
        if spec.backend == "nccl":
            env.update({k: env.get(k, v) for k, v in NCCL_ERROR_HANDLING.items()})
        return subprocess.Popen(
            [sys.executable, "-m", "worldserve.ranks.worker", "--launch", str(path)],
            stdin=subprocess.DEVNULL, env=env)

    def join(self) -> None:
        """Wait until every peer loaded, then form the process group (rank 0 joins last)."""
        import torch.distributed as dist

        waiting = set(self.peers)
        deadline = time.monotonic() + self.spec.start_timeout_s
        while waiting:
            self._check_alive("while loading")
            if time.monotonic() > deadline:
                raise RankGroupError(f"ranks {sorted(waiting)} did not load within "
                                     f"{self.spec.start_timeout_s:g} s")
            for reply in self._receive(POLL_MS):
                if isinstance(reply, RankReady):
                    waiting.discard(reply.rank)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        if self.spec.backend == "nccl":
            for key, value in NCCL_ERROR_HANDLING.items():
                os.environ.setdefault(key, value)
        dist.init_process_group(
            self.spec.backend, store=self._store, rank=0, world_size=self.spec.world_size,
            timeout=datetime.timedelta(seconds=self.spec.timeout_s))
        if self.spec.backend == "nccl":  # gloo raises on a dead peer by itself
            self._watch = PeerWatch(self.peers, abort_process_groups)
        self.ready = True
        log.info("rank group epoch %d ready: %d ranks", self.epoch, self.spec.world_size)

    def restart(self, reason: str) -> None:
        """Kill every peer and start a fresh set (joined at the next `join()`)."""
        log.error("rank group epoch %d broke: %s; restarting it", self.epoch, reason)
        self._teardown()
        self.epoch += 1
        self.spawn()

    def close(self) -> None:
        """Stop the peers (a Shutdown command, then signals) and remove the private folder.
        Idempotent (also registered with atexit)."""
        if self._closed:
            return
        self._closed = True
        if self.ready:
            try:
                self.send(Shutdown(seq=0))
            except RankGroupError:
                pass
        self._teardown(grace_s=KILL_GRACE_S)
        self._sock.close(0)
        self._ctx.term()
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def _teardown(self, grace_s: float = 0.0) -> None:
        import torch.distributed as dist

        if self._watch is not None:
            self._watch.stop()
            self._watch = None
        deadline = time.monotonic() + grace_s
        for proc in self.peers.values():
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait()
        self.peers.clear()
        if self.ready and dist.is_initialized():
            dist.destroy_process_group()
        self.ready = False
        self._store = None
        self._drain()

    # ------------------------------------------------------------------ commands

    def send(self, command: RankCommand) -> int:
        """Send `command` (with a fresh sequence number) to every peer; returns the number."""
        self.seq += 1
        command.seq = self.seq
        payload = self._codec.encode(command)
        for rank in self.peers:
            try:
                self._sock.send_multipart([_identity(rank), payload])
            except zmq.ZMQError as exc:
                raise RankGroupError(f"rank {rank} is not reachable ({exc})") from None
        return self.seq

    def wait_done(self, seq: int, timeout_s: float | None = None) -> dict[int, str | None]:
        """Every peer's outcome of command `seq` (rank -> error or None); RankGroupError when a
        peer exits or does not answer within `timeout_s` (default: parallel.timeout_s)."""
        pending = set(self.peers)
        errors: dict[int, str | None] = {}
        limit_s = self.spec.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit_s
        while pending:
            self._check_alive("while running a step")
            if time.monotonic() > deadline:
                raise RankGroupError(f"ranks {sorted(pending)} did not finish within "
                                     f"{limit_s:g} s (parallel.timeout_s)")
            for reply in self._receive(POLL_MS):
                if isinstance(reply, RankDone) and reply.seq == seq:
                    pending.discard(reply.rank)
                    errors[reply.rank] = reply.error
        return errors

    def dead_peer(self) -> str | None:
        """How the first peer that exited ended, or None when all run."""
        for rank, proc in self.peers.items():
            if proc.poll() is not None:
                return f"rank {rank} (pid {proc.pid}) {describe_exit(proc.returncode)}"
        return None

    def wait_for_dead_peer(self, grace_s: float) -> str | None:
        """`dead_peer()`, polled for up to `grace_s`."""
        deadline = time.monotonic() + grace_s
        while True:
            dead = self.dead_peer()
            if dead is not None or time.monotonic() >= deadline:
                return dead
            time.sleep(0.02)

    def pids(self) -> dict[int, int]:
        return {rank: proc.pid for rank, proc in self.peers.items()}

    def _check_alive(self, when: str) -> None:
        dead = self.dead_peer()
        if dead is not None:
            raise RankGroupError(f"{dead} {when}")

    def _receive(self, timeout_ms: float) -> list[RankReady | RankDone]:
        out: list[RankReady | RankDone] = []
        if not self._sock.poll(timeout_ms):
            return out
        while True:
            try:
                _, data = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return out
            try:
                out.append(self._codec.decode_reply(data))
            except msgspec.DecodeError:
                log.warning("dropped an undecodable message from a peer rank")

    def _drain(self) -> None:
        """Drop replies a killed group left queued (they belong to the old epoch)."""
        while self._receive(0):
            pass


def _identity(rank: int) -> bytes:
    return f"rank-{rank}".encode()


def peer_identity(rank: int) -> bytes:
    """The ZeroMQ identity a peer connects with (ranks/worker.py)."""
    return _identity(rank)


def layout_fields(parallel: Any) -> dict[str, int | bool]:
    """The stage config's `parallel` as ParallelLayout keyword arguments."""
    return {"cfg": parallel.cfg, "ulysses": parallel.ulysses, "ring": parallel.ring,
            "shard": parallel.shard, "vae": parallel.vae}
