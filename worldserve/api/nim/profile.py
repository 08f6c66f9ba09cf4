"""What a NIM client reads about one runtime: `/v1/metadata`, `/v1/manifest`, `/v1/version`,
`/v1/license`, readiness, and the runtime-aware 404 (cookbook operations.md, api-reference.md).

A runtime is `generator` (the generation stage, `POST /v1/infer`) or `reasoner` (the reasoner
stage, `POST /v1/chat/completions`). `selectedModelProfileId` is
`worldserve:<served name>:<backend>:<dtype, or fp8/nvfp4 for quantised weights>` followed by
`:<model_variant>` when the checkpoint has one (models/cosmos3/profile.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import worldserve
from worldserve.api.runtime import ServerRuntime
from worldserve.ipc.capabilities import GenerationCapabilities, ReasonerCapabilities

NimRuntime = Literal["generator", "reasoner"]
STAGES: dict[str, str] = {"generator": "generation", "reasoner": "reasoner"}
ENDPOINTS: dict[str, str] = {"generator": "/v1/infer", "reasoner": "/v1/chat/completions"}
# The other runtime's primary routes (POST): a 404 that names the runtime they need.
FOREIGN_ROUTES: dict[str, tuple[str, ...]] = {
    "generator": ("/v1/chat/completions", "/v1/responses", "/v1/completions"),
    "reasoner": ("/v1/infer",),
}
QUANTISED = ("fp8", "nvfp4")
DTYPE_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
LICENSE = {"object": "license", "name": "Apache-2.0",
           "url": "https://www.apache.org/licenses/LICENSE-2.0"}


@dataclass(frozen=True)
class RuntimeFacts:
    name: str  # served model name
    url: str  # model path as configured
    backend: str
    dtype: str
    precision: str
    variant: str | None

    @property
    def profile_id(self) -> str:
        label = self.precision if self.precision in QUANTISED else self.dtype
        tail = f":{self.variant}" if self.variant else ""
        return f"worldserve:{self.name}:{self.backend}:{label}{tail}"


def root_runtime(runtime: ServerRuntime) -> NimRuntime:
    """The runtime the root routes describe: `--nim-runtime`, else the reasoner when enabled."""
    config = runtime.config
    if config.nim_runtime is not None:
        return config.nim_runtime
    return "reasoner" if config.stages.reasoner.enabled else "generator"


def served_runtimes(runtime: ServerRuntime) -> list[NimRuntime]:
    """The runtimes whose stage is enabled (each gets its /nim/<runtime> mount)."""
    stages = runtime.config.stages
    out: list[NimRuntime] = []
    if stages.generation.enabled:
        out.append("generator")
    if stages.reasoner.enabled:
        out.append("reasoner")
    return out


def runtime_facts(runtime: ServerRuntime, kind: NimRuntime) -> RuntimeFacts:
    stage = STAGES[kind]
    client = runtime.clients.get(stage)
    stage_config = getattr(runtime.config.stages, stage)
    info = client.info if client is not None else None
    caps = info.capabilities if info else None
    declared = caps if isinstance(caps, (GenerationCapabilities, ReasonerCapabilities)) else None
    backend = getattr(stage_config, "backend", "diffusers")
    if isinstance(caps, ReasonerCapabilities):
        backend = caps.backend or backend
    dtype = (caps.dtype if isinstance(caps, ReasonerCapabilities) and caps.dtype else
             stage_config.dtype)
    return RuntimeFacts(
        name=info.model if info else (stage_config.served_model_name or stage),
        url=runtime.public_path(info.model_path if info else str(stage_config.model_path or ""),
                                info.model if info else stage_config.served_model_name or stage),
        backend=backend, dtype=dtype,
        precision=(declared.precision if declared else "") or DTYPE_NAMES.get(dtype, dtype),
        variant=declared.variant if declared else None)


def metadata_body(runtime: ServerRuntime, kind: NimRuntime) -> dict[str, Any]:
    facts = runtime_facts(runtime, kind)
    reasoner = runtime.config.stages.reasoner
    streaming = kind == "reasoner" and reasoner.streaming.enabled
    served = getattr(runtime.config.stages, STAGES[kind]).enabled
    return {
        "model_type": kind,
        # None without the stage: NIM clients then refuse this server, as they should
        "inference_endpoint": ENDPOINTS[kind] if served else None,
        "selectedModelProfileId": facts.profile_id,
        "model_variant": facts.variant,
        "precision": facts.precision,
        "modelInfo": [{"shortName": facts.name, "modelUrl": facts.url}],
        "version": worldserve.__version__,
        "streaming": {"enabled": streaming, "websocket": streaming, "rest": streaming},
    }


def manifest_body(runtime: ServerRuntime, kind: NimRuntime) -> dict[str, Any]:
    """The selected profile and the one profile this server has for the runtime."""
    facts = runtime_facts(runtime, kind)
    stage_config = getattr(runtime.config.stages, STAGES[kind])
    return {"object": "manifest", "selectedModelProfileId": facts.profile_id,
            "profiles": [{"profileId": facts.profile_id, "model_type": kind,
                          "model_variant": facts.variant, "precision": facts.precision,
                          "backend": facts.backend, "device": stage_config.device,
                          "model": facts.name}]}


def version_body() -> dict[str, Any]:
    return {"object": "version", "release": worldserve.__version__, "api": "v1",
            "server": "worldserve"}


def health_body(runtime: ServerRuntime, kind: NimRuntime) -> tuple[int, dict[str, Any]]:
    """Readiness of one runtime: its stage is ready (the NIM's normalised body)."""
    stage = STAGES[kind]
    state = runtime.stage_states().get(stage, "stopped")
    if state == "ready":
        return 200, {"object": "health.response", "message": "Service is ready",
                     "status": "ready"}
    return 503, {"object": "health.response", "message": "Service is not ready",
                 "status": state}


def foreign_route_message(kind: NimRuntime, path: str) -> str:
    other = "reasoner" if kind == "generator" else "generator"
    return (f"The selected runtime is '{kind}', which serves POST {ENDPOINTS[kind]}. "
            f"POST {path} requires a {other} deployment.")
