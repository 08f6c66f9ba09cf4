"""The whole server: the HTTP side (bind address, media policy, outputs, proxies) and its
stages, with the checks that span stages."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

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
    """The whole server. Secrets (the admin key) are not part of it."""

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # uvicorn's access log: one line per HTTP request and WebSocket handshake (--no-access-log).
    access_log: bool = True
    allowed_local_media_path: Path | None = None
    allowed_media_domains: list[str] = Field(default_factory=list)
    max_upload_bytes: int = Field(default=32 * 1024 * 1024, ge=1)
    output_ttl_s: float = Field(default=0.0, ge=0)
    max_job_records: int = Field(default=0, ge=0)
    # Base of the absolute `url`s in responses (e.g. https://media.example.com); None: each
    # request's own scheme and host.
    public_url: str | None = None
    # Proxies whose X-Forwarded-Proto/For/Host are believed (comma-separated IPs/CIDRs, "*").
    forwarded_allow_ips: str = "127.0.0.1"
    # Which runtime the root /v1/metadata (and /v1/health/ready, /v1/manifest) describes to NIM
    # clients; None: the reasoner when it is enabled, else the generator. The NIM-compatible
    # mounts /nim/generator and /nim/reasoner always describe their own (docs/nim.md).
    nim_runtime: Literal["generator", "reasoner"] | None = None
    stages: StagesConfig = Field(default_factory=StagesConfig)

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


