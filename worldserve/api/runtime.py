"""What the routes reach through `app.state.runtime`: config, stage clients, shutdown hooks.

The services live next to it in `app.state.services` (api/services.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Protocol

from worldserve.api.metrics import Metrics
from worldserve.config import ServerConfig
from worldserve.errors import StageUnavailable
from worldserve.ipc.client import StageClient

log = logging.getLogger("worldserve.api")

ShutdownHook = Callable[[], Awaitable[None]]


class JobLister(Protocol):
    """`GET /v1/videos` over several api replicas, each holding its own records
    (cluster/listing.py); the same page, order and cursor rules as one replica's listing."""

    async def page(self, after: str | None, limit: int, descending: bool,
                   base_url: str) -> dict[str, Any]: ...
SHUTDOWN_HOOK_TIMEOUT_S = 5.0


@dataclass
class ServerRuntime:
    """Everything the app is built around. Tests build one around their own stage clients."""

    config: ServerConfig
    clients: dict[str, StageClient]
    admin_key: str | None = None
    # --api-key: the bearer key every inference route needs (api/security.py); None: open.
    api_key: str | None = None
    metrics: Metrics = field(default_factory=Metrics)
    started_at: float = field(default_factory=time.time)
    # pid per stage, filled by the supervisor (shown in /admin/server_info)
    stage_pids: dict[str, int | None] = field(default_factory=dict)
    # While the supervisor restarts a stage: when (time.monotonic()) it should be back; the
    # stage's 503s say so in Retry-After (api/errors.py).
    stage_back_at: dict[str, float] = field(default_factory=dict)
    # Awaited on orderly shutdown, before the stages stop (e.g. live jobs become `cancelled`).
    shutdown_hooks: list[ShutdownHook] = field(default_factory=list)
    # Appended to the ids this api mints (job and session ids). Cluster mode sets
    # ".<api replica>" so that its ingress router can send later calls to this replica.
    id_tag: str = ""
    # Cluster mode with several api replicas: lists every replica's video jobs.
    job_lister: JobLister | None = None

    async def run_shutdown_hooks(self) -> None:
        """Run every hook with a time bound; one failing hook does not stop the others."""
        for hook in self.shutdown_hooks:
            try:
                await asyncio.wait_for(hook(), SHUTDOWN_HOOK_TIMEOUT_S)
            except Exception:
                log.exception("shutdown hook %r failed", hook)

    @property
    def hides_file_paths(self) -> bool:
        """Responses leave out output files' absolute paths (`show_server_paths` off, or the
        generation stage's `hide_file_paths`)."""
        return (not self.config.show_server_paths
                or self.config.stages.generation.hide_file_paths)

    def public_path(self, path: str | None, stand_in: str | None) -> str | None:
        """A server path as responses may show it: `stand_in` (e.g. the model's name) unless
        the operator asked to show server paths."""
        return path if self.config.show_server_paths else stand_in

    def client(self, stage: str) -> StageClient:
        """The stage's client, or 503 when the stage is not configured or is down."""
        client = self.clients.get(stage)
        if client is None:
            raise StageUnavailable(f"stage '{stage}' is not enabled on this server", stage=stage)
        if client.down_reason is not None:
            raise StageUnavailable(
                f"stage '{stage}' is unavailable: {client.down_reason}", stage=stage
            )
        return client

    def stage_states(self) -> dict[str, str]:
        return {name: client.state for name, client in self.clients.items()}
