"""Route modules. Each exposes `router` (an APIRouter), or `routers(services) -> list of
APIRouter` when what it mounts depends on the surfaces that are on, and optionally
`setup(services: ApiServices) -> bool` (False: the surface is off, its routes stay out).

`ROUTE_MODULES` is the order in which create_app includes them.
"""

ROUTE_MODULES: tuple[str, ...] = (
    "worldserve.api.routes.ops",
    "worldserve.api.routes.admin",
    "worldserve.api.routes.model_admin",
    "worldserve.api.routes.sglang",
    "worldserve.api.routes.images",
    "worldserve.api.routes.videos",
    "worldserve.api.routes.infer",
    "worldserve.api.routes.actions",
    "worldserve.api.routes.outputs",
    "worldserve.api.routes.metadata",
    "worldserve.api.routes.streaming",
    "worldserve.api.routes.chat",
    "worldserve.api.routes.responses",
    "worldserve.api.routes.realtime",
    "worldserve.api.routes.web",
    # last: each /nim/<runtime> mount ends in a catch-all 404 of its prefix
    "worldserve.api.routes.nim",
)
