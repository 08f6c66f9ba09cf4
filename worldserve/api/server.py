"""Run the api process: start the stages, serve HTTP, stop everything on the way out."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import sys
from typing import Iterator

import uvicorn

from worldserve.api.allocator import hold_malloc_thresholds
from worldserve.api.app import create_app
from worldserve.api.logs import quiet_uvicorn
from worldserve.api.runtime import SHUTDOWN_HOOK_TIMEOUT_S, ServerRuntime, ShutdownHook
from worldserve.api.startup import StartupApp
from worldserve.config import ServerConfig, is_loopback_host
from worldserve.runtime.supervisor import StageStartError, Supervisor

log = logging.getLogger("worldserve.server")

GRACEFUL_SHUTDOWN_S = 3
WS_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
LISTEN_BACKLOG = 2048  # uvicorn's default


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, before_shutdown: ShutdownHook) -> None:
        super().__init__(config)
        self.before_shutdown = before_shutdown  # replaced at the hand-over to the full app

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # Before uvicorn drops the connections (open WebSockets would get 1012 from it): the
        # app closes its WebSockets with 1001 and deletes the streaming sessions.
        try:
            await asyncio.wait_for(self.before_shutdown(), SHUTDOWN_HOOK_TIMEOUT_S)
        except Exception:
            log.exception("closing the open sessions on shutdown failed")
        await super().shutdown(sockets)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and sockets:  # uvicorn says where it listens only on sockets it bound
            port = sockets[0].getsockname()[1]
            log.info("listening on http://%s:%d while the stages start (Ctrl+C to quit)",
                     self.config.host, port)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn re-raises SIGTERM/SIGINT after its shutdown, which would kill this process
        # before the stages are stopped and the sockets removed; the caller does that instead.
        with super().capture_signals():
            try:
                yield
            finally:
                self._captured_signals.clear()


class PortUnavailable(OSError):
    """The HTTP address cannot be bound; the message names it and what to do."""


def bind_listener(host: str, port: int) -> socket.socket:
    """The server's listening socket, bound before the stages load (uvicorn serves on it)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise PortUnavailable(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        hint = (" (another server?); pick another with --port, or PORT= with make serve"
                if exc.errno == errno.EADDRINUSE else "")
        raise PortUnavailable(f"cannot listen on {host}:{port}: {exc.strerror}{hint}") from None
    sock.set_inheritable(True)
    return sock


async def serve(config: ServerConfig, admin_key: str | None, api_key: str | None = None) -> int:
    """Bind the port, answer it at once (api/startup.py) while the stages start, then serve
    the full app until a signal or a fatal stage failure; return the exit code."""
    exit_code = 0
    server: _Server | None = None
    hold_malloc_thresholds()  # freed large blocks go back to the system (api/allocator.py)

    def on_fatal(reason: str) -> None:
        nonlocal exit_code
        exit_code = 1
        log.error("%s; shutting down", reason)
        if server is not None:
            server.should_exit = True

    if not is_loopback_host(config.host) and config.allowed_local_media_path is None:
        log.warning("serving on %s without --allowed-local-media-path: requests may name "
                    "server-local media files", config.host)
    try:
        listener = bind_listener(config.host, config.port)
    except PortUnavailable as exc:  # before any stage loads: fail in a second, not in 30
        print(f"worldserve: {exc}", file=sys.stderr, flush=True)
        return 1
    stage_pids: dict[str, int | None] = {}
    supervisor = Supervisor(config, on_fatal=on_fatal, on_restart=stage_pids.__setitem__)
    front = StartupApp(supervisor.progress)
    server = _Server(uvicorn.Config(
        front, host=config.host, port=config.port, log_level=config.log_level,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, ws_max_size=WS_MAX_MESSAGE_BYTES,
        access_log=config.access_log,
        proxy_headers=False,  # the app's ForwardedHeadersMiddleware does it (api/middleware.py)
    ), before_shutdown=_nothing_open)
    quiet_uvicorn(config.access_log)  # after uvicorn.Config set its logging up
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    runtime: ServerRuntime | None = None
    try:
        start_error = await _start_stages(supervisor, serving)
        if start_error is None and not serving.done():
            stage_pids.update({n: s.pid for n, s in supervisor.stages.items()})
            runtime = ServerRuntime(config=config, clients=supervisor.clients,
                                    admin_key=admin_key, api_key=api_key,
                                    stage_pids=stage_pids,
                                    stage_back_at=supervisor.back_at)
            app = create_app(runtime)
            await front.hand_over(app)
            server.before_shutdown = app.state.services.before_shutdown
            log.info("every stage is ready: serving on http://%s:%d", config.host,
                     listener.getsockname()[1])
        elif start_error is not None:  # stop answering, then say why (the last line)
            exit_code = 1
            server.should_exit = True
        await serving
        if start_error is not None:
            print(f"worldserve: {start_error}", file=sys.stderr, flush=True)
        if not server.started and exit_code == 0:
            exit_code = 1  # uvicorn logged why
    finally:
        if not serving.done():  # an exception on our side: let uvicorn close the port
            server.should_exit = True
            await asyncio.gather(serving, return_exceptions=True)
        listener.close()
        if runtime is not None:
            await runtime.run_shutdown_hooks()
        await supervisor.stop()
    return exit_code


async def _nothing_open() -> None:
    """Shutdown before the hand-over: no WebSocket or session is open yet."""


async def _start_stages(supervisor: Supervisor, serving: asyncio.Task[None]) -> str | None:
    """Start the stages while uvicorn serves the start-up answers. The message of a stage that
    could not start; None when every stage started or the server stopped first (Ctrl+C,
    SIGTERM, a uvicorn failure: the stages started so far are then stopped)."""
    starting = asyncio.ensure_future(supervisor.start())
    await asyncio.wait({starting, serving}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        log.info("stopping during start-up: stopping the stages started so far")
        starting.cancel()  # Supervisor.start stops what it started
        await asyncio.gather(starting, return_exceptions=True)
        return None
    exc = starting.exception()
    if isinstance(exc, StageStartError):
        return str(exc)
    if exc is not None:
        raise exc
    return None
