"""Deploy worldserve on Ray Serve: one deployment per stage kind, the api as the ingress.

Each enabled stage is its own Serve application (`worldserve-<stage>`, no HTTP route) whose
replicas wrap one engine each (`StageReplica`, `num_gpus: 1` per replica where the cluster has
GPUs) and route through the `OwnerRouter`. The api is today's FastAPI app (same routes,
WebSockets, error contracts) as the ingress of the `worldserve` application, built on each api
replica around `RayStageClient`s.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping

import ray
from fastapi import FastAPI
from ray import serve
from ray.serve.config import RequestRouterConfig

from worldserve.api.allocator import hold_malloc_thresholds
from worldserve.api.app import create_app
from worldserve.api.jobs.service import MediaService
from worldserve.api.runtime import ServerRuntime
from worldserve.api.server import PortUnavailable, bind_listener
from worldserve.cluster.client import RayStageClient
from worldserve.cluster.ids import api_tag
from worldserve.cluster.listing import KIND, ClusterJobLister, Row, local_rows
from worldserve.cluster.replica import StageReplica
from worldserve.cluster.router import ApiRouter, OwnerRouter
from worldserve.config import ServerConfig

log = logging.getLogger("worldserve.cluster")

API_APP = "worldserve"
API_DEPLOYMENT = "api"
HANDSHAKE_TIMEOUT_S = 600.0
ROUTING_STATS_PERIOD_S = 1.0
MAX_ONGOING_REQUESTS = 256  # a replica queues in its engine; Serve must not hold calls back
STAGE_KINDS = ("generation", "reasoner", "realtime")


@dataclass(frozen=True)
class ClusterOptions:
    ray_address: str | None = None
    replicas: Mapping[str, int] = field(default_factory=dict)  # stage -> replicas (default 1)
    api_replicas: int = 1
    # Tests and benchmarks: stage -> "module:Class" built instead of the configured engine.
    engine_targets: Mapping[str, str] = field(default_factory=dict)
    num_gpus_per_replica: float | None = None  # None: 1 when the cluster has GPUs, else 0


def parse_replicas(text: str | None) -> dict[str, int]:
    """`generation=2,reasoner=1` -> {"generation": 2, "reasoner": 1}; ValueError names the fault."""
    counts: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        name, sep, value = part.partition("=")
        if not sep or name not in STAGE_KINDS:
            raise ValueError(f"--replicas takes STAGE=N pairs with STAGE one of "
                             f"{', '.join(STAGE_KINDS)} (got '{part}')")
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"--replicas {name} must be a whole number >= 1 (got '{value}')")
        counts[name] = int(value)
    return counts


def stage_app_name(stage: str) -> str:
    return f"worldserve-{stage}"


def _num_gpus(options: ClusterOptions) -> float:
    if options.num_gpus_per_replica is not None:
        return options.num_gpus_per_replica
    return 1.0 if ray.cluster_resources().get("GPU", 0) > 0 else 0.0


def replica_num_gpus(stage: str, config: ServerConfig, per_replica: float) -> float:
    """GPUs one replica of `stage` asks Ray for: `per_replica`, and a generation replica running
    a rank group (stages.generation.parallel) one per rank, which then sees them all
    (ranks/group.py `rank_devices`). On a cluster without GPUs (0) the ranks use gloo."""
    if stage == "generation" and per_replica > 0:
        return max(per_replica, float(config.stages.generation.parallel.world_size))
    return per_replica


def stage_application(stage: str, config: ServerConfig, options: ClusterOptions) -> Any:
    deployment = serve.deployment(
        StageReplica,
        name=stage,
        num_replicas=options.replicas.get(stage, 1),
        max_ongoing_requests=MAX_ONGOING_REQUESTS,
        ray_actor_options={"num_cpus": 0,
                           "num_gpus": replica_num_gpus(stage, config, _num_gpus(options))},
        request_router_config=RequestRouterConfig(
            request_router_class=OwnerRouter,
            request_routing_stats_period_s=ROUTING_STATS_PERIOD_S,
        ),
    )
    return deployment.bind(stage, config.model_dump_json(), options.engine_targets.get(stage))


@serve.ingress()
class WorldserveApi:
    """One api replica: the FastAPI app around a `RayStageClient` per stage. The ids it mints
    name it (`ApiRouter` sends their later calls here); with several api replicas, each keeps
    its job records and output copies in its own `api-<replica>` folder of the output dir."""

    async def __init__(self, config_json: str, stages: list[str], admin_key: str | None,
                       num_api_replicas: int = 1, api_key: str | None = None) -> None:
        hold_malloc_thresholds()  # this replica's process is an api process (api/allocator.py)
        replica = serve.get_replica_context().replica_id.unique_id
        self.config = ServerConfig.model_validate_json(config_json)
        if num_api_replicas > 1:
            self.config = own_output_dir(self.config, f"api-{replica}")
        output_dir = self.config.stages.generation.resolved_output_dir()
        self.clients = {
            stage: RayStageClient(stage, serve.get_deployment_handle(stage, stage_app_name(stage)),
                                  output_dir=output_dir if stage == "generation" else None)
            for stage in stages
        }
        await asyncio.gather(*(c.handshake(HANDSHAKE_TIMEOUT_S) for c in self.clients.values()))
        lister = ClusterJobLister(serve.get_deployment_handle(API_DEPLOYMENT, API_APP), API_APP,
                                  API_DEPLOYMENT) if num_api_replicas > 1 else None
        self.replica = replica
        self.runtime = ServerRuntime(config=self.config, clients=dict(self.clients),
                                     admin_key=admin_key, api_key=api_key,
                                     id_tag=api_tag(replica),
                                     job_lister=lister)
        self.asgi_app: FastAPI | None = None  # (`app` is Serve's ingress property)

    def __serve_build_asgi_app__(self) -> FastAPI:
        self.asgi_app = create_app(self.runtime)
        return self.asgi_app

    # The merged `GET /v1/videos` (cluster/listing.py) asks every api replica for these.

    async def job_position(self, job_id: str) -> tuple[int, int] | None:
        return self._media().ledger.position(job_id, KIND)

    async def job_rows(self, anchor: tuple[int, int] | None, limit: int, descending: bool,
                       base_url: str) -> list[Row]:
        return local_rows(self._media(), self.replica, anchor, limit, descending, base_url)

    def _media(self) -> MediaService:
        assert self.asgi_app is not None  # built by Serve before any call
        media = self.asgi_app.state.services.media
        assert media is not None  # the generation stage is enabled (jobs were listed)
        return media


def own_output_dir(config: ServerConfig, name: str) -> ServerConfig:
    """`config` with the generation output dir moved to its subfolder `name`."""
    data = config.model_dump(mode="json")
    data["stages"]["generation"]["output_dir"] = str(
        config.stages.generation.resolved_output_dir() / name)
    return ServerConfig.model_validate(data)


def api_application(config: ServerConfig, admin_key: str | None, options: ClusterOptions,
                    api_key: str | None = None) -> Any:
    stages = list(config.stages.enabled())
    deployment = serve.deployment(
        WorldserveApi, name=API_DEPLOYMENT, num_replicas=options.api_replicas,
        max_ongoing_requests=MAX_ONGOING_REQUESTS, ray_actor_options={"num_cpus": 0},
        request_router_config=RequestRouterConfig(request_router_class=ApiRouter))
    return deployment.bind(config.model_dump_json(), stages, admin_key, options.api_replicas,
                           api_key)


def deploy(config: ServerConfig, admin_key: str | None, options: ClusterOptions,
           api_key: str | None = None) -> None:
    """Start Serve's HTTP proxy on the configured host/port and deploy stages, then the api."""
    serve.start(http_options={"host": config.host, "port": config.port})
    serve.run_many([  # the stages load side by side; the api then handshakes with each
        serve.RunTarget(stage_application(stage, config, options), name=stage_app_name(stage),
                        route_prefix=None)
        for stage in config.stages.enabled()
    ])
    serve.run(api_application(config, admin_key, options, api_key), name=API_APP,
              route_prefix="/")


def shutdown() -> None:
    """Tear down every application and Serve itself (the Ray cluster stays)."""
    serve.shutdown()


def run(config: ServerConfig, admin_key: str | None, options: ClusterOptions,
        api_key: str | None = None) -> int:
    """`worldserve serve --cluster ray`: deploy, serve until SIGINT/SIGTERM, undeploy."""
    try:  # Serve's proxy binds it later: say now, before Ray and the replicas start
        bind_listener(config.host, config.port).close()
    except PortUnavailable as exc:
        print(f"worldserve: {exc}", file=sys.stderr, flush=True)
        return 1
    ray.init(address=options.ray_address, include_dashboard=False)
    try:
        try:
            deploy(config, admin_key, options, api_key)
        except RuntimeError as exc:  # Serve's "Deploying application ... failed: <cause>"
            print(f"worldserve: {exc}", file=sys.stderr, flush=True)
            return 1
        print(json.dumps({"event": "serving", "host": config.host, "port": config.port,
                          "replicas": {s: options.replicas.get(s, 1)
                                       for s in config.stages.enabled()},
                          "api_replicas": options.api_replicas}), flush=True)
        _wait_for_signal()
    finally:
        shutdown()
        ray.shutdown()
    return 0


def _wait_for_signal() -> None:
    stop = asyncio.Event()

    async def wait() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()

    asyncio.run(wait())
