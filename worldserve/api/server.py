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

from worldserve.api.app import create_app
from worldserve.api.logs import quiet_uvicorn
from worldserve.api.runtime import SHUTDOWN_HOOK_TIMEOUT_S, ServerRuntime, ShutdownHook
from worldserve.api.services import ApiServices
from worldserve.config import ServerConfig, is_loopback_host
from worldserve.runtime.supervisor import StageStartError, Supervisor

log = logging.getLogger("worldserve.server")

GRACEFUL_SHUTDOWN_S = 3
WS_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
LISTEN_BACKLOG = 2048  # uvicorn's default


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, before_shutdown: ShutdownHook) -> None:
        super().__init__(config)
        self._before_shutdown = before_shutdown

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # Before uvicorn drops the connections (open WebSockets would get 1012 from it): the
        # app closes its WebSockets with 1001 and deletes the streaming sessions.
        try:
            await asyncio.wait_for(self._before_shutdown(), SHUTDOWN_HOOK_TIMEOUT_S)
        except Exception:
            log.exception("closing the open sessions on shutdown failed")
        await super().shutdown(sockets)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and sockets:  # uvicorn says where it listens only on sockets it bound
            port = sockets[0].getsockname()[1]
            log.info("serving on http://%s:%d (Ctrl+C to quit)", self.config.host, port)

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


async def serve(config: ServerConfig, admin_key: str | None) -> int:
    """Start stages, serve until a signal or a fatal stage failure; return the exit code."""
    exit_code = 0
    server: _Server | None = None

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
    try:
        await supervisor.start()
    except StageStartError as exc:
        listener.close()
        print(f"worldserve: {exc}", file=sys.stderr, flush=True)
        return 1
    stage_pids.update({n: s.pid for n, s in supervisor.stages.items()})
    runtime = ServerRuntime(config=config, clients=supervisor.clients, admin_key=admin_key,
                            stage_pids=stage_pids, stage_back_at=supervisor.back_at)
    app = create_app(runtime)
    services: ApiServices = app.state.services
    server = _Server(uvicorn.Config(
        app, host=config.host, port=config.port, log_level=config.log_level,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, ws_max_size=WS_MAX_MESSAGE_BYTES,
        access_log=config.access_log,
        proxy_headers=False,  # the app's ForwardedHeadersMiddleware does it (api/middleware.py)
    ), before_shutdown=services.before_shutdown)
    quiet_uvicorn(config.access_log)  # after uvicorn.Config set its logging up
    try:
        await server.serve(sockets=[listener])
        if not server.started and exit_code == 0:
            exit_code = 1  # uvicorn logged why
    finally:
        listener.close()
        await runtime.run_shutdown_hooks()
        await supervisor.stop()
    return exit_code
