"""SGLang diffusion's own routes (sglang multimodal_gen `common_api.py` and its docs), over
worldserve's machinery:

- `GET /models` (no `/v1`) and `GET /v1/model_info`: SGLang's field names (`model_path`,
  `task_type`, `pipeline_name`, `pipeline_class`, `num_gpus`, `dit_precision`,
  `vae_precision`); paths only where the operator shows server paths.
- `POST /v1/set_lora`, `/v1/merge_lora_weights`, `/v1/unmerge_lora_weights`,
  `GET /v1/list_loras`: the admin LoRA routes' relay and auth (routes/model_admin.py). SGLang's
  `set_lora` makes the adapter apply to every later request; here it loads the adapter (when
  `lora_path` is given) and makes it the server's active adapter set, which image, video and
  action requests that name no `lora` of their own run with (`MediaService.active_lora`).
  `merge_lora_weights` sets the active adapters' strength, `unmerge_lora_weights` clears the set:
  worldserve never folds an adapter into the base weights, so "merged" and "unmerged" differ in
  speed on SGLang and in nothing here. A field worldserve cannot honour (`target` other than the
  transformer, `lora_alpha`) is a 400 naming it.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from worldserve.api.errors import OpenAIRoute
from worldserve.api.routes.model_admin import MAX_PATH_CHARS, relay
from worldserve.api.security import require_admin
from worldserve.api.services import ApiServices, media_service
from worldserve.errors import InvalidRequest
from worldserve.ipc.client import new_request_id
from worldserve.ipc.messages import LoraList, LoraLoad, LoraRef

router = APIRouter(tags=["sglang"], route_class=OpenAIRoute)
admin = APIRouter(tags=["sglang"], dependencies=[Depends(require_admin)],
                  route_class=OpenAIRoute)

# SGLang's targets; worldserve's adapters apply to the generation transformer(s).
TARGETS = ("all", "transformer")
MAX_SCALE = 100.0


def setup(services: ApiServices) -> bool:
    return services.media is not None


def routers(services: ApiServices) -> list[APIRouter]:
    return [router, admin]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


Nickname = str | list[str]


class SetLoraBody(_Body):
    lora_nickname: Nickname
    lora_path: str | list[str | None] | None = None
    target: Literal["all", "transformer", "transformer_2", "critic"] | list[str] = "all"
    strength: float | list[float] = Field(default=1.0)
    merge_mode: Literal["auto", "merge", "dynamic"] | None = None
    lora_alpha: int | list[int | None] | None = None


class MergeBody(_Body):
    target: str = "all"
    strength: float = Field(default=1.0, ge=-MAX_SCALE, le=MAX_SCALE)


class UnmergeBody(_Body):
    target: str = "all"


def _listed(value: Any, count: int, name: str) -> list[Any]:
    """SGLang's "one value or one per nickname"."""
    if not isinstance(value, list):
        return [value] * count
    if len(value) != count:
        raise InvalidRequest(f"{name} must give one value per lora_nickname ({count})",
                             param=name)
    return value


def _check_target(target: str) -> None:
    if target not in TARGETS:
        raise InvalidRequest(f"target {target!r} is not available: worldserve applies an "
                             "adapter to the generation transformer (target 'all' or "
                             "'transformer')", param="target")


def _ok(message: str) -> dict[str, str]:
    return {"status": "ok", "message": message}


@router.get("/models")
async def models(request: Request) -> dict[str, Any]:
    """SGLang's model facts, named as SGLang names them."""
    service = media_service(request)
    caps = service.capabilities()
    info = service.client().info
    model = service.model_name()
    task = "TI2V" if caps.image_conditioning else "T2V"  # SGLang's TaskType names
    return {"model_path": service.runtime.public_path(info.model_path if info else None, model),
            "task_type": task, "pipeline_name": caps.family or caps.pipeline,
            "pipeline_class": caps.pipeline, "num_gpus": 1,
            "dit_precision": caps.precision or None, "vae_precision": None}


@router.get("/v1/model_info")
async def model_info(request: Request) -> dict[str, Any]:
    service = media_service(request)
    info = service.client().info
    return {"model_path": service.runtime.public_path(info.model_path if info else None,
                                                      service.model_name())}


@admin.post("/v1/set_lora")
async def set_lora(body: SetLoraBody, request: Request) -> dict[str, str]:
    names = body.lora_nickname if isinstance(body.lora_nickname, list) else [body.lora_nickname]
    if not names:
        raise InvalidRequest("lora_nickname must name an adapter", param="lora_nickname")
    paths = _listed(body.lora_path, len(names), "lora_path")
    strengths = _listed(body.strength, len(names), "strength")
    for target in _listed(body.target, len(names), "target"):
        _check_target(target)
    if body.lora_alpha is not None:
        raise InvalidRequest("lora_alpha is not supported: worldserve reads the adapter's "
                             "alpha from its files", param="lora_alpha")
    loaded = {a["name"]: a.get("path") for a in await _adapters(request)}
    for name, path, strength in zip(names, paths, strengths):
        # SGLang clients repeat set_lora with the same nickname and path: loaded, it is reused
        if path is not None and loaded.get(name) != path:
            if len(path) > MAX_PATH_CHARS:
                raise InvalidRequest("lora_path is too long", param="lora_path")
            await relay(request, LoraLoad(request_id=new_request_id("lora"), name=name,
                                          path=path, scale=strength))
    refs = [LoraRef(name=name, scale=strength) for name, strength in zip(names, strengths)]
    await _require_loaded(request, names)
    media_service(request).active_lora = refs
    return _ok(f"Successfully set LoRA adapter(s): {', '.join(names)} (strength: "
               f"{', '.join(f'{s:g}' for s in strengths)})")


async def _require_loaded(request: Request, names: list[str]) -> None:
    loaded = {a["name"] for a in (await _adapters(request))}
    missing = [name for name in names if name not in loaded]
    if missing:
        raise InvalidRequest(f"LoRA adapter {missing[0]!r} is not loaded: give its lora_path",
                             param="lora_path")


async def _adapters(request: Request) -> list[dict[str, Any]]:
    listed = await relay(request, LoraList(request_id=new_request_id("lora")))
    return list(listed.get("adapters", []))


@admin.post("/v1/merge_lora_weights")
async def merge_lora_weights(request: Request, body: MergeBody | None = None) -> dict[str, str]:
    body = body or MergeBody()
    _check_target(body.target)
    service = media_service(request)
    if not service.active_lora:
        raise InvalidRequest("no LoRA adapter is set: POST /v1/set_lora first",
                             param="lora_nickname")
    service.active_lora = [LoraRef(name=ref.name, scale=body.strength)
                           for ref in service.active_lora]
    return _ok(f"Successfully merged LoRA weights (target: {body.target}, strength: "
               f"{body.strength:g})")


@admin.post("/v1/unmerge_lora_weights")
async def unmerge_lora_weights(request: Request,
                               body: UnmergeBody | None = None) -> dict[str, str]:
    body = body or UnmergeBody()
    _check_target(body.target)
    media_service(request).active_lora = []
    return _ok(f"Successfully unmerged LoRA weights (target: {body.target})")


@admin.get("/v1/list_loras")
async def list_loras(request: Request) -> dict[str, Any]:
    """The loaded adapters and the active set (what requests without `lora` run with)."""
    active = media_service(request).active_lora
    return {"loaded_adapters": await _adapters(request),
            "active": [{"nickname": ref.name, "strength": ref.scale} for ref in active]}
