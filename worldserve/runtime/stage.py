"""The stage process: load the engine, then loop receive -> schedule -> run -> send.

Started by the supervisor as `python -m worldserve.runtime.stage --stage NAME --config FILE
--address ADDR`. A stage that cannot load prints one line naming the cause on stderr and exits
with status 1 (a traceback too with --log-level debug).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import gc
import heapq
import logging
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Iterator, Protocol

from worldserve import envs
from worldserve.config import ServerConfig
from worldserve.errors import WorldserveError
from worldserve.ipc.messages import (
    AdminResult,
    Cancel,
    Echo,
    EchoReply,
    ErrorReply,
    Hello,
    Message,
    ModelInfoRequest,
    Ping,
    Request,
    StageInfo,
    StageStats,
    StageStatus,
    StatsRequest,
)
from worldserve.ipc.transport import StageServer
from worldserve.runtime import colocation
from worldserve.runtime.engine import Engine, create_engine
from worldserve.runtime.quiet import quiet_benign_messages
from worldserve.runtime.telemetry import StageTelemetry

log = logging.getLogger("worldserve.stage")

IDLE_POLL_MS = 50
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when the api process dies (no orphan stages)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


class StageSocket(Protocol):
    """What the stage loop receives from and replies through: the ZeroMQ `StageServer` of a
    stage process, or the in-process client's mailbox (`runtime/inprocess.py`)."""

    def receive(self, timeout_ms: float) -> list[tuple[bytes, Message | None]]:
        """Every message waiting (after at most `timeout_ms`); undecodable ones as None."""

    def send(self, peer: bytes, msg: Message) -> None: ...

    def close(self) -> None: ...


class StageLoop:
    """Owns the socket and the engine; routes replies back to the peer that asked. One
    `beat()` is one turn of the stage: the stage process runs it in a loop, the in-process
    client runs it on its event loop."""

    def __init__(self, stage: str, server: StageSocket, engine: Engine) -> None:
        self.stage = stage
        self.server = server
        self.engine = engine
        self.running = True
        self._peers: set[bytes] = set()
        self._echoes: list[tuple[float, int, bytes, EchoReply]] = []
        self._echo_seq = 0
        self._last_state = engine.state()
        self.telemetry = StageTelemetry()

    def info(self, request_id: str) -> StageInfo:
        return StageInfo(
            request_id=request_id,
            stage=self.stage,
            pid=os.getpid(),
            state=self.engine.state(),
            model=self.engine.model_name,
            model_path=self.engine.model_path,
            num_params=self.engine.num_params,
            capabilities=self.engine.capabilities(),
        )

    def model_info(self) -> dict:
        """GET /admin/model_info for an engine without admin operations: what StageInfo says."""
        info = self.info("model-info")
        return {"stage": self.stage, "model": info.model, "path": info.model_path,
                "num_params": info.num_params, "state": info.state,
                "lora": {"supported": False, "adapters": []}}

    def run(self) -> None:
        while self.running:
            self.beat(IDLE_POLL_MS)

    def beat(self, idle_ms: float) -> bool:
        """One turn: receive (waiting up to `idle_ms` when idle), answer, send the echoes that
        fell due, run one engine step, broadcast a state change. True when the engine had work
        (then the caller turns again at once)."""
        due_ms = self.next_due_ms()
        wait_ms = idle_ms if due_ms is None else min(idle_ms, due_ms)
        timeout_ms = 0 if self.engine.has_work() else wait_ms
        for peer, msg in self.server.receive(timeout_ms):
            self._dispatch(peer, msg)
        self._send_due_echoes()
        busy = self.engine.has_work()
        if busy:
            self.step_engine()
        self._broadcast_state_change()
        return busy

    def step_engine(self) -> None:
        """One engine step, timed for /metrics (runtime/telemetry.py)."""
        started = time.perf_counter()
        self.engine.step()
        self.telemetry.observe_step(time.perf_counter() - started)

    def next_due_ms(self) -> float | None:
        """Milliseconds until the next echo falls due (0 when overdue); None when none waits.
        An idle stage waits for messages at most this long."""
        if not self._echoes:
            return None
        return max(0.0, (self._echoes[0][0] - time.monotonic()) * 1000)

    def _dispatch(self, peer: bytes, msg: Message | None) -> None:
        self._peers.add(peer)
        if msg is None:
            log.warning("dropped an undecodable message from %r", peer)
            return
        if isinstance(msg, (Hello, Ping)):
            self.server.send(peer, self.info(msg.request_id))
        elif isinstance(msg, StatsRequest):
            self.server.send(peer, self.stats(msg.request_id))
        elif isinstance(msg, Echo):
            self._schedule_echo(peer, msg)
        elif isinstance(msg, Cancel):
            self.engine.cancel(msg.target_id)
        elif isinstance(msg, ModelInfoRequest) and not hasattr(self.engine, "admin"):
            self.server.send(peer, AdminResult(request_id=msg.request_id,
                                               data=self.model_info()))
        elif isinstance(msg, Request):
            self._submit(peer, msg)
        else:
            log.warning("ignored unexpected %s", type(msg).__name__)

    def _submit(self, peer: bytes, request: Request) -> None:
        def send(out: Message) -> None:
            self.server.send(peer, out)

        reply = self.telemetry.timed(request, send)
        try:
            self.engine.submit(request, reply)
        except WorldserveError as exc:
            reply(ErrorReply(request_id=request.request_id, code=exc.code, message=exc.message))
        except Exception as exc:  # one bad request must not take the stage down
            log.exception("request %s failed", request.request_id)
            reply(
                ErrorReply(request_id=request.request_id, code="internal_error", message=str(exc))
            )

    def stats(self, request_id: str) -> StageStats:
        stats = dict(self.engine.stats())
        extra = {**stats.pop("extra", {}), "telemetry": self.telemetry.snapshot()}
        return StageStats(request_id=request_id, extra=extra, **stats)

    def _schedule_echo(self, peer: bytes, msg: Echo) -> None:
        due = time.monotonic() + max(0.0, msg.delay_ms) / 1000
        self._echo_seq += 1
        out = EchoReply(request_id=msg.request_id, payload=msg.payload)
        heapq.heappush(self._echoes, (due, self._echo_seq, peer, out))

    def _send_due_echoes(self) -> None:
        now = time.monotonic()
        while self._echoes and self._echoes[0][0] <= now:
            _, _, peer, out = heapq.heappop(self._echoes)
            self.server.send(peer, out)

    def _broadcast_state_change(self) -> None:
        state = self.engine.state()
        if state == self._last_state:
            return
        self._last_state = state
        log.info("stage %s is %s", self.stage, state)
        for peer in self._peers:
            self.server.send(peer, StageStatus(stage=self.stage, state=state))


def run_together(loops: list[StageLoop], yield_mode: str = "steps",
                 max_yield_ms: float = 250.0) -> None:
    """Several stages in one process (a colocated stage): one thread alternates their ticks,
    so each engine's `step()` stays one bounded unit and neither starves the other. With
    `yield_mode` "blocks" the first (host) engine also pauses before each transformer block of
    its forward and lets the others take turns there while they have work, at most
    `max_yield_ms` per pause (runtime/colocation.py)."""
    host, guests = loops[0], loops[1:]
    yielding = colocation.install(host, guests, yield_mode, max_yield_ms)
    idle_ms = IDLE_POLL_MS / len(loops)
    try:
        while all(loop.running for loop in loops):
            busy = any(loop.engine.has_work() for loop in loops)
            for loop in loops:
                loop.beat(0 if busy else idle_ms)
                if yielding is not None:
                    yielding.raise_guest_error()
    finally:
        colocation.uninstall(host)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="worldserve-stage")
    parser.add_argument("--stage", required=True)
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--address", required=True)
    # A second stage served from this process (its engine may share the first one's weights).
    parser.add_argument("--colocate", default=None, help="NAME=ADDRESS of a colocated stage")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    _die_with_parent()
    args = _parse_args(argv)
    config = ServerConfig.model_validate_json(args.config.read_text())
    debug = config.log_level == "debug"
    logging.basicConfig(
        level=config.log_level.upper(),
        format=f"%(asctime)s %(levelname)s [{args.stage}] %(name)s: %(message)s",
    )
    if not debug:
        quiet_benign_messages()
    stages = [(args.stage, args.address)]
    if args.colocate:
        name, _, address = args.colocate.partition("=")
        stages.append((name, address))
    loops: list[StageLoop] = []
    try:
        with gc_paused():
            threads = envs.torch_num_threads()
            if threads:
                import torch

                torch.set_num_threads(threads)
            # in order: a later engine may reuse an earlier's weights
            for name, address in stages:
                loop = _start_stage(name, address, config, debug)
                if loop is None:
                    _close(loops)
                    return 1
                loops.append(loop)
    except BaseException:
        _close(loops)
        raise
    _serve(loops, config)
    return 0


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the start (imports, model build, warm-up), then
    one full collection. The imports alone leave about 800,000 tracked objects, and the
    collector rescanning them as they pile up cost about a fifth of a dev stage's start
    (1.2-1.6 of 5.5 CPU-s, most of the rest is importing torch, diffusers and transformers),
    paid again at every restart; the one collection after costs 0.4 s."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
            gc.collect()


def _serve(loops: list[StageLoop], config: ServerConfig) -> None:
    """Run the loops until SIGTERM, then shut every engine down."""
    stopping = StopSignal(loops)
    signal.signal(signal.SIGTERM, stopping.handle)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the api process owns Ctrl+C
    try:
        if len(loops) == 1:
            loops[0].run()
        else:
            reasoner = config.stages.reasoner
            run_together(loops, reasoner.colocation_yield, reasoner.colocation_max_yield_ms)
        stopping.step_finished()
    finally:
        _close(loops)
    stopping.stopped()


def _close(loops: list[StageLoop]) -> None:
    for loop in loops:
        loop.engine.shutdown()
        loop.server.close()


class StopSignal:
    """SIGTERM: finish the current engine step, shut the engine down, exit 0. Says on stderr
    when it arrived and how long the step and the shutdown took, so that a supervisor that has
    to SIGKILL a stage can show why (runtime/supervisor.py)."""

    def __init__(self, loops: list[StageLoop]) -> None:
        self.loops = loops
        self.names = "+".join(loop.stage for loop in loops)
        self.received_at: float | None = None
        self.step_done_at: float | None = None

    def handle(self, *_: object) -> None:
        self.received_at = time.monotonic()
        for loop in self.loops:
            loop.running = False
        # os.write, not logging: a signal handler must not take the logging lock.
        os.write(2, f"stage {self.names}: SIGTERM received; stopping after the current "
                    "step\n".encode())

    def step_finished(self) -> None:
        self.step_done_at = time.monotonic()

    def stopped(self) -> None:
        if self.received_at is None or self.step_done_at is None:
            return
        log.info("stage %s stopped %.2f s after SIGTERM (current step %.2f s, engine shutdown "
                 "%.2f s)", self.names, time.monotonic() - self.received_at,
                 self.step_done_at - self.received_at, time.monotonic() - self.step_done_at)


def _start_stage(name: str, address: str, config: ServerConfig, debug: bool) -> StageLoop | None:
    """Bind the stage's socket and load its engine; None (after printing why) on failure."""
    try:
        server = StageServer(address)
    except Exception as exc:
        print(f"stage {name}: cannot bind {address}: {exc}", file=sys.stderr)
        return None
    try:
        engine = create_engine(name, getattr(config.stages, name), config)
    except Exception as exc:
        if debug:
            traceback.print_exc()
        print(f"stage {name} failed to start: {exc}", file=sys.stderr, flush=True)
        server.close()
        return None
    return StageLoop(name, server, engine)


def exit_now(code: int) -> None:
    """Exit without the interpreter's teardown. The engines are shut down and every output was
    written atomically; what remains is garbage-collecting the model graphs, which took longer
    than the supervisor's grace period on a loaded CPU (the stage was then SIGKILLed). The
    atexit callbacks still run (a rank group stops its peer processes in one)."""
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
