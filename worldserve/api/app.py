"""`create_app(runtime)`: the FastAPI app built around injected stage clients.

The services are built here, before the first request (api/services.py); each route module's
`setup(services)` says whether its surface is on.
"""

from __future__ import annotations

import importlib

from fastapi import FastAPI

import worldserve
from worldserve.api.errors import install_error_handlers
from worldserve.api.middleware import (
    BodyLimitMiddleware,
    ForwardedHeadersMiddleware,
    MetricsMiddleware,
    max_request_body_bytes,
)
from worldserve.api.routes import ROUTE_MODULES
from worldserve.api.runtime import ServerRuntime
from worldserve.api.security import ApiKeyMiddleware
from worldserve.api.services import build_services


def create_app(runtime: ServerRuntime) -> FastAPI:
    services = build_services(runtime)
    app = FastAPI(title="worldserve", version=worldserve.__version__, lifespan=services.lifespan)
    app.state.runtime = runtime
    app.state.services = services
    install_error_handlers(app)
    for name in ROUTE_MODULES:
        module = importlib.import_module(name)
        setup = getattr(module, "setup", None)
        if setup is not None and setup(services) is False:
            continue  # the module declined (feature disabled): its routes stay unregistered
        build = getattr(module, "routers", None)  # routers that depend on the surfaces on
        for router in build(services) if build is not None else [module.router]:
            app.include_router(router)
    if runtime.api_key is not None:  # inside the metrics: refused requests are counted
        app.add_middleware(ApiKeyMiddleware, api_key=runtime.api_key)
    app.add_middleware(BodyLimitMiddleware,
                       max_bytes=max_request_body_bytes(runtime.config.max_upload_bytes))
    app.add_middleware(MetricsMiddleware, metrics=runtime.metrics)
    app.add_middleware(ForwardedHeadersMiddleware,
                       trusted_hosts=runtime.config.forwarded_allow_ips)
    return app
