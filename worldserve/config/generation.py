"""The generation stage (images, video jobs, actions) and its single-device speed levers:
attention backend, compiled blocks, understanding K/V reuse, step caching, VAE tiling."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from worldserve.config.base import FrozenConfig
from worldserve.config.loading import GenerationParallelConfig, StageConfig

# diffusers 0.42.1's attention backends (`AttentionBackendName` in
# models/attention_dispatch.py); whether this machine can run one is checked at stage startup.
ATTENTION_BACKENDS = (
    "native", "flash", "flash_hub", "flash_varlen", "flash_varlen_hub", "flash_4_hub",
    "_flash_3", "_flash_varlen_3", "_flash_3_hub", "_flash_3_varlen_hub", "aiter_fa2_hub",
    "flex", "_native_cudnn", "_native_efficient", "_native_flash", "_native_math",
    "_native_npu", "_native_xla", "sage", "sage_hub", "sage_blackwell_hub", "sage_varlen",
    "_sage_qk_int8_pv_fp8_cuda", "_sage_qk_int8_pv_fp8_cuda_sm90",
    "_sage_qk_int8_pv_fp16_cuda", "_sage_qk_int8_pv_fp16_triton", "xformers")
# diffusers cache hooks that do not run on Cosmos3 in diffusers 0.42.1, and why.
UNSUPPORTED_STEP_CACHES = {
    "fbcache": "diffusers' FBCache reads the block input as `hidden_states`, which Cosmos3's "
               "decoder layer does not take (it fails at the first forward)",
    "magcache": "MagCache needs mag_ratios calibrated for the checkpoint and none are "
                "published for Cosmos3",
    "teacache": "TeaCache has no Cosmos3 coefficients",
}


class StepCacheConfig(FrozenConfig):
    """Step caching on the generation transformer (docs/generation.md, "Step caching"): the
    diffusers cache hooks are installed at startup when the model's family declares support;
    a request caches when it sends `enable_teacache: true`, or, with `default: true`, unless it
    sends `enable_teacache: false`."""

    enabled: bool = Field(default=True, description=(
        "Install the step cache hooks (off: a request's enable_teacache: true is a 400)."))
    method: Literal["seacache", "taylorseer"] = Field(default="seacache", description=(
        "Step cache method (SGLang's enable_teacache turns it on per request)."))
    threshold: float | None = Field(default=None, ge=0, le=10, description=(
        "seacache: how much change a step may skip (higher: more skipped forwards)."))
    interval: int | None = Field(default=None, ge=1, le=100, description=(
        "taylorseer: a full forward every N steps."))
    default: bool = Field(default=False, description=(
        "Requests that omit enable_teacache cache too."))

    @model_validator(mode="before")
    @classmethod
    def _known_method(cls, data: Any) -> Any:
        method = str(data.get("method", "")).lower() if isinstance(data, dict) else ""
        why = UNSUPPORTED_STEP_CACHES.get(method)
        if why is not None:
            raise ValueError(f"step_cache.method {method}: {why}; use seacache or taylorseer")
        return data

    @model_validator(mode="after")
    def _knob_fits_method(self) -> StepCacheConfig:
        if self.method == "taylorseer" and self.threshold is not None:
            raise ValueError("step_cache.threshold does not apply to taylorseer; set "
                             "step_cache.interval (a full forward every N steps)")
        if self.method != "taylorseer" and self.interval is not None:
            raise ValueError(f"step_cache.interval applies to taylorseer only; {self.method} "
                             f"takes step_cache.threshold")
        return self


class GenerationStageConfig(StageConfig):
    """Images, video jobs and actions."""

    LIFTED_OVERRIDES: ClassVar[dict[str, str]] = {
        "warmup_mode": "warmup_mode", "warmup_resolutions": "warmup_resolutions",
        "attention_backend": "attention_backend", "enable_torch_compile": "compile"}

    output_dir: Path = Field(default=Path("outputs"), description="Where generated media go.")
    max_batch_size: int = Field(default=4, ge=1, le=64)
    batch_wait_ms: float = Field(default=10.0, ge=0, le=10_000)
    # Requests denoising at once, across all running batches; the engine advances the batches
    # round-robin, one phase each. Rows per batch are also capped by the runner's max_batch_size.
    max_running_requests: int = Field(default=4, ge=1, le=1024)
    warmup_steps: int = Field(default=2, ge=1, le=100)
    warmup_resolutions: list[str] | None = None
    prompt_enhancer: Path | None = None
    # Requests admitted at once across the native media routes; beyond it 503 + Retry-After.
    max_in_flight: int = Field(default=32, ge=1, le=100_000)
    # Per-request deadline for hung (not dead) stages -> job failed with code `timeout`.
    request_timeout_s: float = Field(default=3600.0, gt=0)
    # DELETE of a running job waits this long for the stage to confirm the cancellation.
    video_cancel_timeout_s: float = Field(default=10.0, ge=0)
    # Omit absolute `file_path(s)` from responses even with `show_server_paths`.
    hide_file_paths: bool = False
    # Cosmos3: run the cosmos_guardrail safety checker (text before, video after generation);
    # when true and the package is missing, the stage fails to start.
    safety_checker: bool = False
    parallel: GenerationParallelConfig = Field(
        default_factory=GenerationParallelConfig, description=(
            "One request across several ranks, one device each, e.g. cfg=2,ulysses=2 (axes "
            "cfg, ulysses, ring, shard)."))
    # A backend this machine cannot run fails startup (checked with a probe call).
    attention_backend: str = Field(default="native", description=(
        "The transformer's attention kernel, one of diffusers' backends (native: torch "
        "SDPA; flash, _flash_3, sage, flex, _native_cudnn, ...)."))
    compile: bool = Field(default=False, description=(
        "torch.compile the transformer's repeated blocks (dynamic shapes), paid during the "
        "warmup."))
    # Bit-exact with recomputation; stands aside for rows that cache steps.
    understanding_kv_reuse: bool = Field(default=True, description=(
        "Cosmos3: reuse the understanding (text) stream's K/V across a row's denoising "
        "steps."))

    @field_validator("attention_backend")
    @classmethod
    def _known_attention_backend(cls, backend: str) -> str:
        if backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend: {backend!r} is not a diffusers attention "
                             f"backend (choices: {', '.join(ATTENTION_BACKENDS)})")
        return backend

    @model_validator(mode="after")
    def _speed_levers_run_on_one_device(self) -> GenerationStageConfig:
        if self.parallel.world_size > 1 and (self.attention_backend != "native" or self.compile):
            raise ValueError("attention_backend and compile apply to one-process generation "
                             "only; with parallel ranks keep attention_backend: native and "
                             "compile: false")
        return self
    # Step caching (`enable_teacache`); installed only where the model's family supports it.
    step_cache: StepCacheConfig = Field(default_factory=StepCacheConfig)

    # VAE decode (docs/generation.md "VAE decode"): spatial tiling (the Wan VAE's
    # `enable_tiling`; tile size and stride in output pixels, None: the VAE's own 256/192),
    # and decoding a row a few latent frames per engine step (0: one call per row) so that
    # interleaved jobs keep stepping during a long decode. Chunks are bit-equal to the plain
    # decode; tiles are not (blended seams; the docs give the measured difference).
    vae_tiling: bool = Field(default=False, description=(
        "Decode in overlapping spatial tiles (the Wan VAE's enable_tiling)."))
    vae_tile_size: int | None = Field(default=None, ge=32, le=8192, description=(
        "Tile size in output pixels (needs VAE tiling)."))
    vae_tile_stride: int | None = Field(default=None, ge=16, le=8192, description=(
        "Tile stride in output pixels, at most the tile size (needs VAE tiling)."))
    vae_decode_chunk_frames: int = Field(default=0, ge=0, le=1024, description=(
        "Latent frames decoded per engine step, so that other jobs keep stepping (0: a "
        "row's decode is one step)."))

    @model_validator(mode="after")
    def _tile_sizes_need_tiling(self) -> GenerationStageConfig:
        if not self.vae_tiling and (self.vae_tile_size or self.vae_tile_stride):
            raise ValueError("vae_tile_size / vae_tile_stride need vae_tiling: true")
        if (self.vae_tile_size and self.vae_tile_stride
                and self.vae_tile_stride > self.vae_tile_size):
            raise ValueError(f"vae_tile_stride {self.vae_tile_stride} must not exceed "
                             f"vae_tile_size {self.vae_tile_size} (tiles would leave gaps)")
        return self

    @model_validator(mode="before")
    @classmethod
    def _factory_output_dir(cls, data: Any) -> Any:
        """The seed's spelling `factory: {output_dir: DIR}`; an explicit `output_dir` (the
        `--output-dir` flag lands there) wins."""
        if not isinstance(data, dict) or "factory" not in data:
            return data
        data = dict(data)
        factory = data.pop("factory")
        if not isinstance(factory, dict):
            raise ValueError("factory: expected a mapping such as {output_dir: outputs}")
        unknown = sorted(set(factory) - {"output_dir"})
        if unknown:
            raise ValueError(f"factory.{unknown[0]}: not a setting worldserve acts on "
                             f"(known: output_dir)")
        if "output_dir" in factory:
            data.setdefault("output_dir", factory["output_dir"])
        return data

    @field_validator("warmup_resolutions")
    @classmethod
    def _resolutions_are_sizes(cls, sizes: list[str] | None) -> list[str] | None:
        for size in sizes or []:
            w, sep, h = size.lower().partition("x")
            if not (sep and w.isdigit() and h.isdigit() and int(w) > 0 and int(h) > 0):
                raise ValueError(f"warmup_resolutions: {size!r} is not a positive WIDTHxHEIGHT")
        return sizes

    def resolved_output_dir(self) -> Path:
        """Absolute output directory (both the api process and the stage resolve it alike)."""
        return self.output_dir.expanduser().resolve()


