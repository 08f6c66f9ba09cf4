"""The whole server: the HTTP side (bind address, media policy, outputs, proxies) and its
stages, with the checks that span stages."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from worldserve.config.base import FrozenConfig
from worldserve.config.generation import GenerationStageConfig
from worldserve.config.loading import StageConfig
from worldserve.config.realtime import RealtimeStageConfig
from worldserve.config.reasoner import ReasonerStageConfig


class StagesConfig(FrozenConfig):
    generation: GenerationStageConfig = Field(default_factory=GenerationStageConfig)
    reasoner: ReasonerStageConfig = Field(default_factory=ReasonerStageConfig)
    realtime: RealtimeStageConfig = Field(default_factory=RealtimeStageConfig)

    def enabled(self) -> dict[str, StageConfig]:
        """Enabled stages by name, in start order."""
        out: dict[str, StageConfig] = {}
        for name in type(self).model_fields:
            stage = getattr(self, name)
            if stage.enabled:
                out[name] = stage
        return out


class ServerConfig(FrozenConfig):
    """The whole server. Secrets (the admin key, the API key) are not part of it."""

    host: str = Field(default="127.0.0.1", description="Bind address of the HTTP server.")
    port: int = Field(default=8000, ge=0, le=65535, description="HTTP port (0: any free one).")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="Log level of the api and stage processes.")
    access_log: bool = Field(default=True, description=(
        "uvicorn's access log: a line per HTTP request and WebSocket handshake."))
    allowed_local_media_path: Path | None = Field(default=None, description=(
        "Local media paths in requests must resolve inside this directory."))
    allowed_media_domains: list[str] = Field(default_factory=list, description=(
        "Allowed remote media host (repeatable, comma-separated allowed)."))
    max_upload_bytes: int = Field(default=32 * 1024 * 1024, ge=1, description=(
        "Largest accepted upload per file, in bytes."))
    output_ttl_s: float = Field(default=0.0, ge=0, description=(
        "Delete generated outputs and their records this many seconds after they finish "
        "(0: never)."))
    max_job_records: int = Field(default=0, ge=0, description=(
        "Keep at most this many image/video records; the oldest finished ones go first "
        "(0: unlimited)."))
    public_url: str | None = Field(default=None, description=(
        "Base of the absolute URLs in responses, e.g. https://media.example.com."))
    forwarded_allow_ips: str = Field(default="127.0.0.1", description=(
        "Proxies whose X-Forwarded-Proto/For/Host are believed (comma-separated IPs or "
        "CIDRs, * for any)."))
    show_server_paths: bool = Field(default=False, description=(
        "Show absolute server paths in responses (file_path(s), /v1/models root, action "
        "model_path, NIM modelUrl); hidden by default."))
    # The NIM-compatible mounts /nim/generator and /nim/reasoner always describe their own
    # (docs/nim.md).
    nim_runtime: Literal["generator", "reasoner"] | None = Field(default=None, description=(
        "The runtime the root /v1/metadata, /v1/health/ready and /v1/manifest describe to NIM "
        "clients."))
    # vLLM's and SGLang's `--served-model-name A B ...`: clients that always send their own id
    # (e.g. `nvidia/Cosmos3-Super`) are served by configuration (api/model_names.py).
    served_model_names: list[str] = Field(default_factory=list, description=(
        "Names the served model answers to (repeatable, or several after one flag): the first "
        "is every stage's listed id (a stage's own served_model_name wins), the others are "
        "accepted as aliases in requests' `model`."))
    stages: StagesConfig = Field(default_factory=StagesConfig)

    @model_validator(mode="before")
    @classmethod
    def _first_name_reaches_every_stage(cls, data: Any) -> Any:
        """The first served name becomes the served_model_name of each stage without its own;
        run again on the stage processes' copy, it changes nothing."""
        if not isinstance(data, dict) or not data.get("served_model_names"):
            return data
        stages = data.get("stages") or {}
        if not isinstance(stages, dict):
            return data
        first = data["served_model_names"][0]
        named = {name: {**(stages.get(name) or {})} for name in StagesConfig.model_fields
                 if isinstance(stages.get(name) or {}, dict)}
        for stage in named.values():
            stage["served_model_name"] = stage.get("served_model_name") or first
        return {**data, "stages": {**stages, **named}}

    @model_validator(mode="after")
    def _colocation_is_possible(self) -> ServerConfig:
        reasoner, generation = self.stages.reasoner, self.stages.generation
        if not (reasoner.enabled and reasoner.colocate_with_generation):
            return self
        if not generation.enabled:
            raise ValueError("stages.reasoner.colocate_with_generation needs the generation "
                             "stage enabled")
        if reasoner.device != generation.device:
            raise ValueError(f"stages.reasoner.colocate_with_generation needs one device; got "
                             f"reasoner {reasoner.device!r}, generation {generation.device!r}")
        return self

    @model_validator(mode="after")
    def _nim_runtime_is_served(self) -> ServerConfig:
        stage = {"generator": "generation", "reasoner": "reasoner"}.get(self.nim_runtime or "")
        if stage is not None and not getattr(self.stages, stage).enabled:
            raise ValueError(f"nim_runtime {self.nim_runtime!r} needs the {stage} stage enabled")
        return self

    @field_validator("public_url")
    @classmethod
    def _public_url_is_a_base(cls, url: str | None) -> str | None:
        if url is None:
            return None
        if not url.startswith(("http://", "https://")) or "?" in url or "#" in url:
            raise ValueError(f"must be an http(s) base URL such as https://host[:port][/prefix] "
                             f"(got {url!r})")
        return url.rstrip("/")

    @field_validator("allowed_media_domains")
    @classmethod
    def _lower_domains(cls, domains: list[str]) -> list[str]:
        out: list[str] = []
        for item in domains:
            out.extend(d.strip().lower() for d in item.split(",") if d.strip())
        return out


