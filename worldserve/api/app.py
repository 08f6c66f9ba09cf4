"""`create_app(runtime)`: the FastAPI app built around injected stage clients."""

from __future__ import annotations

import importlib

from fastapi import FastAPI

import worldserve
from worldserve.api.errors import install_error_handlers
from worldserve.api.middleware import BodyLimitMiddleware, MetricsMiddleware, max_request_body_bytes
from worldserve.api.routes import ROUTE_MODULES
from worldserve.api.runtime import ServerRuntime


def create_app(runtime: ServerRuntime) -> FastAPI:
    app = FastAPI(title="worldserve", version=worldserve.__version__)
    app.state.runtime = runtime
    install_error_handlers(app)
    for name in ROUTE_MODULES:
        module = importlib.import_module(name)
        setup = getattr(module, "setup", None)
        if setup is not None and setup(runtime) is False:
            continue  # the module declined (feature disabled): its routes stay unregistered
        app.include_router(module.router)
    app.add_middleware(BodyLimitMiddleware,
                       max_bytes=max_request_body_bytes(runtime.config.max_upload_bytes))
    app.add_middleware(MetricsMiddleware, metrics=runtime.metrics)
    return app
