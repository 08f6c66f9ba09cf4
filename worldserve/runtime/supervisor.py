"""Starts, watches and stops the stage processes (runs inside the api process).

Each stage gets a socket address unique to this server instance (a socket file in a private
run folder, or a free loopback port), a readiness handshake with a timeout, and a watcher:
when a stage dies, its client fails every waiter with 503 at once; when a critical stage
(generation) dies, `on_fatal` asks the server to exit non-zero.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import worldserve
from worldserve import envs
from worldserve.config import ServerConfig, StageConfig
from worldserve.ipc.client import StageClient, ZmqStageClient
from worldserve.ipc.messages import StageInfo
from worldserve.runtime.devices import (
    DeviceProbeError,
    apply_plan,
    server_plan,
    stage_environment,
)
from worldserve.runtime.placement import PlacementPlan, format_plan
from worldserve.runtime.restart import RestartPolicy
from worldserve.runtime.run_dirs import make_run_dir

log = logging.getLogger("worldserve.supervisor")

CRITICAL_STAGES = frozenset({"generation"})
STOP_GRACE_S = 5.0
STDERR_TAIL_LINES = 40


class StageStartError(RuntimeError):
    """A stage could not start; the message is the stage's own reason."""


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class StageProcess:
    name: str
    config: StageConfig
    address: str
    client: ZmqStageClient
    proc: asyncio.subprocess.Process | None = None
    stderr_tail: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=STDERR_TAIL_LINES)
    )
    exit_reason: str | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    start_s: float = 0.0  # how long its last start took (spawn to handshake)
    spawned_at: float | None = None  # time.monotonic() of the last spawn
    ready: bool = False  # its last start's handshake succeeded

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def failure_message(self) -> str:
        """The stage's own last words, else how it ended."""
        # (a colocated stage shares its host's stderr: only this stage's own line counts)
        for line in reversed(self.stderr_tail):
            if f"{self.name} failed to start" in line or f"{self.name}: cannot bind" in line:
                return line.split("failed to start: ", 1)[-1]
        tail = [line for line in self.stderr_tail if line.strip()]
        reason = self.exit_reason or "unknown"
        return f"{reason}; last output: {tail[-1]}" if tail else reason


def stop_progress(stage: StageProcess) -> str:
    """How far a stage got after SIGTERM, from its own lines (runtime/stage.py `StopSignal`)."""
    lines = [line for line in stage.stderr_tail if "SIGTERM" in line]
    if not lines:
        return "it never acknowledged the signal: still loading, or stuck outside Python"
    if "stopped" in lines[-1]:
        return "its engine had stopped; the process was still exiting"
    return "its current step had not finished"


def colocated_hosts(config: ServerConfig) -> dict[str, str]:
    """guest stage -> the stage whose process serves it (`reasoner.colocate_with_generation`)."""
    stages = config.stages.enabled()
    reasoner = config.stages.reasoner
    if "reasoner" in stages and "generation" in stages and reasoner.colocate_with_generation:
        return {"reasoner": "generation"}
    return {}


RestartHook = Callable[[str, int], None]  # (stage, new pid)


class Supervisor:
    def __init__(self, config: ServerConfig, on_fatal: Callable[[str], None] | None = None,
                 on_restart: RestartHook | None = None) -> None:
        self.config = config
        self.on_fatal = on_fatal or (lambda reason: None)
        self.on_restart = on_restart or (lambda stage, pid: None)
        self.restarts: dict[str, RestartPolicy] = {}
        # stage -> time.monotonic() at which a restarting stage should answer again
        self.back_at: dict[str, float] = {}
        self.run_dir = make_run_dir(envs.run_dir_root(), config.port)
        self.stages: dict[str, StageProcess] = {}
        self.plan: PlacementPlan | None = None
        self._stopping = False

    @property
    def clients(self) -> dict[str, StageClient]:
        return {name: stage.client for name, stage in self.stages.items()}

    def progress(self) -> dict[str, dict[str, Any]]:
        """Each enabled stage's start so far (served by api/startup.py while the stages start):
        `placing` (the placement plan is being built), `waiting` (not spawned yet), `loading`
        (spawned, no handshake yet, with `elapsed_s` of `timeout_s`) or `ready`."""
        now = time.monotonic()
        out: dict[str, dict[str, Any]] = {}
        for name, stage_config in self.config.stages.enabled().items():
            stage = self.stages.get(name)
            if stage is None:
                out[name] = {"state": "placing" if self.plan is None else "waiting"}
            elif stage.ready:
                out[name] = {"state": "ready", "start_s": round(stage.start_s, 1)}
            elif stage.spawned_at is None:
                out[name] = {"state": "waiting"}
            else:
                timeout_s = envs.stage_start_timeout_s() or stage_config.start_timeout_s
                out[name] = {"state": "loading", "elapsed_s": round(now - stage.spawned_at, 1),
                             "timeout_s": timeout_s}
        return out

    def _address(self, name: str, stage_config: StageConfig) -> str:
        if stage_config.ipc == "tcp":
            return f"tcp://{stage_config.host}:{_free_loopback_port()}"
        return f"ipc://{self.run_dir / (name + '.sock')}"

    async def start(self) -> None:
        """Start every enabled stage and wait for all handshakes; raise StageStartError."""
        config_file = self.run_dir / "config.json"
        config_file.write_text(await self._place())
        for name, stage_config in self.config.stages.enabled().items():
            address = self._address(name, stage_config)
            self.stages[name] = StageProcess(
                name, stage_config, address, ZmqStageClient(name, address)
            )
        hosts = colocated_hosts(self.config)
        try:
            for stage in self.stages.values():
                if stage.name not in hosts:
                    guests = [self.stages[g] for g, h in hosts.items() if h == stage.name]
                    await self._spawn(stage, config_file, guests)
            await asyncio.gather(*(self._handshake(s) for s in self.stages.values()))
        except BaseException:
            await self.stop()
            raise
        for stage in self.stages.values():
            stage.tasks.append(asyncio.get_running_loop().create_task(self._watch(stage)))

    async def _place(self) -> str:
        """Build and log the placement plan; the stages' config with its devices and dtypes
        made concrete (JSON). StageStartError when the plan cannot work."""
        try:
            plan, _ = await asyncio.to_thread(server_plan, self.config)
        except DeviceProbeError as exc:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            raise StageStartError(f"cannot list the GPUs: {exc}") from None
        for line in format_plan(plan):
            log.info("placement: %s", line)
        if not plan.fits:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            raise StageStartError("the placement plan does not work: " + "; ".join(plan.problems))
        self.plan = plan
        return apply_plan(self.config, plan).model_dump_json()

    async def _spawn(self, stage: StageProcess, config_file: Path,
                     guests: list[StageProcess] | None = None) -> None:
        """Start the stage's process; `guests` are stages served from the same process."""
        colocate = [arg for guest in guests or []
                    for arg in ("--colocate", f"{guest.name}={guest.address}")]
        env = dict(os.environ)
        package_root = str(Path(worldserve.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        # what a stage makes under its run root (a rank group's folder) lies in the server's
        # run folder and goes with it: at stop, and at the next start after a SIGKILL
        env["WORLDSERVE_RUN_DIR"] = str(self.run_dir)
        if self.plan is not None:
            env.update(stage_environment(self.plan, stage.name, envs.cuda_visible_devices()))
        stage.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "worldserve.runtime.stage",
            "--stage",
            stage.name,
            "--config",
            str(config_file),
            "--address",
            stage.address,
            *colocate,
            stdin=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        stage.tasks.append(asyncio.get_running_loop().create_task(self._forward_stderr(stage)))
        stage.spawned_at, stage.ready = time.monotonic(), False
        log.info("started stage %s (pid %d) on %s", stage.name, stage.proc.pid, stage.address)
        for guest in guests or []:  # one process: same pid, same last words
            guest.proc, guest.stderr_tail = stage.proc, stage.stderr_tail
            guest.spawned_at, guest.ready = stage.spawned_at, False
            log.info("stage %s runs in the %s process on %s", guest.name, stage.name,
                     guest.address)

    async def _forward_stderr(self, stage: StageProcess) -> None:
        assert stage.proc is not None and stage.proc.stderr is not None
        while line := await stage.proc.stderr.readline():
            text = line.decode(errors="replace").rstrip("\n")
            stage.stderr_tail.append(text)
            print(text, file=sys.stderr, flush=True)

    async def _handshake(self, stage: StageProcess, client: StageClient | None = None) -> None:
        assert stage.proc is not None
        timeout_s = envs.stage_start_timeout_s() or stage.config.start_timeout_s
        started = time.monotonic()
        handshake = asyncio.ensure_future((client or stage.client).handshake(timeout_s))
        exited = asyncio.ensure_future(stage.proc.wait())
        done, _ = await asyncio.wait({handshake, exited}, return_when=asyncio.FIRST_COMPLETED)
        if handshake in done and handshake.exception() is None:
            exited.cancel()
            stage.start_s = time.monotonic() - started
            stage.ready = True
            return
        handshake.cancel()
        if exited in done:
            stage.exit_reason = describe_exit(exited.result())
            await asyncio.sleep(0.1)  # let the stderr forwarder catch the last lines
            raise StageStartError(
                f"stage '{stage.name}' failed to start: {stage.failure_message()}"
            )
        exited.cancel()
        raise StageStartError(
            f"stage '{stage.name}' did not become ready within {timeout_s:g} s "
            f"(stages.{stage.name}.start_timeout_s)"
        )

    async def _watch(self, stage: StageProcess) -> None:
        assert stage.proc is not None
        returncode = await stage.proc.wait()
        if self._stopping:
            return
        stage.exit_reason = describe_exit(returncode)
        log.error("stage %s (pid %d) died: %s", stage.name, stage.proc.pid, stage.exit_reason)
        stage.client.mark_down(stage.exit_reason)
        if stage.name in CRITICAL_STAGES:
            self.on_fatal(f"stage '{stage.name}' died: {stage.exit_reason}")
        elif self._restartable(stage):
            stage.client.reconnect()
            await self._restart(stage)

    def _restartable(self, stage: StageProcess) -> bool:
        """Non-critical stages in a process of their own (a colocated pair shares a process
        with the critical generation stage, whose death stops the server)."""
        return not any(stage.name in pair for pair in colocated_hosts(self.config).items())

    async def _restart(self, stage: StageProcess) -> None:
        """Start the stage again after the policy's delay (runtime/restart.py)."""
        policy = self.restarts.setdefault(stage.name, RestartPolicy())
        delay_s = policy.on_death(asyncio.get_running_loop().time())
        if delay_s is None:
            self.back_at.pop(stage.name, None)
            log.error("stage %s died %d times within %g s; not restarting it again (its routes "
                      "answer 503)", stage.name, policy.num_recent_deaths, policy.window_s)
            return
        log.warning("restarting stage %s in %g s", stage.name, delay_s)
        self.back_at[stage.name] = time.monotonic() + delay_s + stage.start_s
        await asyncio.sleep(delay_s)
        if self._stopping:
            return
        await self._spawn(stage, self.run_dir / "config.json")
        info = await self._handshake_restarted(stage)
        if info is not None:  # its client accepts requests again
            stage.exit_reason = None
            stage.client.revive(info)
            self.back_at.pop(stage.name, None)
            log.info("stage %s restarted (pid %d) in %.1f s", stage.name, stage.pid,
                     stage.start_s)
            self.on_restart(stage.name, stage.pid or 0)
        stage.tasks.append(asyncio.get_running_loop().create_task(self._watch(stage)))

    async def _handshake_restarted(self, stage: StageProcess) -> StageInfo | None:
        """The new process's handshake, through a client of its own (the stage's client
        refuses requests while the stage is down); None when it failed (a process hung while
        loading is killed: its watcher counts that as a death)."""
        probe = ZmqStageClient(stage.name, stage.address)
        try:
            await self._handshake(stage, probe)
        except StageStartError as exc:
            log.error("restarting stage %s failed: %s", stage.name, exc)
            if stage.proc is not None and stage.proc.returncode is None:
                stage.proc.kill()
            return None
        finally:
            await probe.close()
        return probe.info

    async def stop(self) -> None:
        """SIGTERM every stage, SIGKILL after a grace period, remove sockets. Idempotent."""
        if self._stopping:
            return
        self._stopping = True
        # colocated stages share one process: signal and reap it once
        by_proc = {id(s.proc): s for s in self.stages.values() if s.proc}
        live = [s for s in by_proc.values() if s.proc and s.proc.returncode is None]
        for stage in live:
            stage.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        await asyncio.gather(*(self._reap(s) for s in live))
        for stage in self.stages.values():
            for task in stage.tasks:
                task.cancel()
            await stage.client.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)

    async def _reap(self, stage: StageProcess) -> None:
        assert stage.proc is not None
        try:
            await asyncio.wait_for(stage.proc.wait(), STOP_GRACE_S)
        except asyncio.TimeoutError:
            log.warning("stage %s did not exit within %g s of SIGTERM (%s); killing it",
                        stage.name, STOP_GRACE_S, stop_progress(stage))
            stage.proc.kill()
            await stage.proc.wait()
