"""Server and stage configuration: pydantic models, validated once, frozen.

A YAML file (`--config`) gives the whole tree; CLI flags override single fields. Unknown keys
are refused and every error names the dotted path of the offending key.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from worldserve import envs

LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}


class ConfigError(ValueError):
    """A configuration problem, with a message that names the setting."""


def is_loopback_host(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# `--device`: auto (CUDA when torch sees a GPU, else the CPU), cpu, cuda (the placement plan
# picks the GPU(s)), cuda:N (that GPU of the visible ones). docs/hardware.md.
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")
DtypeName = Literal["auto", "float32", "bfloat16", "float16"]


def check_device_name(device: str) -> str:
    """`device` when it is a spelling worldserve accepts; else ValueError naming it."""
    if not DEVICE_PATTERN.fullmatch(device):
        raise ValueError(f"device {device!r} is not one of auto, cpu, cuda, cuda:N")
    return device


BF16_MIN_CAPABILITY = (8, 0)  # older GPUs get float16 under dtype auto


def resolve_dtype_name(dtype: str, device: str, capability: tuple[int, int] | None = None) -> str:
    """`auto` -> bfloat16 on CUDA (float16 below compute capability 8.0), float32 on the CPU."""
    if dtype != "auto":
        return dtype
    if not device.startswith("cuda"):
        return "float32"
    if capability is not None and capability < BF16_MIN_CAPABILITY:
        return "float16"
    return "bfloat16"


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# server_args_overrides keys that worldserve owns (spec native-media.md section 1.3).
OWNED_OVERRIDES = frozenset({"gpu_ids", "base_gpu_id", "model_path", "scheduler_rpc_timeout"})


def _lift_overrides(data: Any, lifted: dict[str, str], accepted: frozenset[str]) -> Any:
    """Move the `server_args_overrides` keys worldserve acts on into their stage fields (the
    seed's spelling, e.g. `warmup_mode`); refuse every key it would otherwise ignore."""
    if not isinstance(data, dict) or not isinstance(data.get("server_args_overrides"), dict):
        return data
    data = dict(data)
    overrides = dict(data["server_args_overrides"])
    for key, field_name in lifted.items():
        if key not in overrides:
            continue
        value = overrides.pop(key)
        if field_name in data and data[field_name] != value:
            raise ValueError(f"server_args_overrides.{key}={value!r} disagrees with "
                             f"{field_name}={data[field_name]!r}; set one of them")
        data[field_name] = value
    for key in overrides:
        if key in OWNED_OVERRIDES:
            raise ValueError(f"server_args_overrides.{key}: worldserve sets this itself")
        if key not in accepted:
            known = ", ".join(sorted({*lifted, *accepted}))
            raise ValueError(f"server_args_overrides.{key}: not a setting worldserve acts on "
                             f"(known: {known})")
    data["server_args_overrides"] = overrides
    return data


class StageConfig(_Frozen):
    """Settings every stage process shares."""

    # server_args_overrides keys moved into a stage field (override key -> field name), and
    # keys read from the overrides as they are; anything else is a startup error.
    LIFTED_OVERRIDES: ClassVar[dict[str, str]] = {"warmup_mode": "warmup_mode"}
    ACCEPTED_OVERRIDES: ClassVar[frozenset[str]] = frozenset({"host"})

    enabled: bool = True
    # auto: CUDA when torch sees a GPU (the placement plan picks which), else the CPU;
    # auto dtype: bfloat16 on CUDA, float32 on the CPU (runtime/placement.py).
    device: str = "auto"
    dtype: DtypeName = "auto"
    model_path: Path | None = None
    served_model_name: str | None = None
    warmup_mode: Literal["off", "server"] = "off"
    start_timeout_s: float = Field(default=300.0, gt=0)
    # Stage sockets: "ipc" (a socket file in the server's run folder) or "tcp" on `host`.
    ipc: Literal["ipc", "tcp"] = "ipc"
    host: str = "127.0.0.1"
    # Engine-specific knobs passed through to the stage (SGLang's server_args naming).
    server_args_overrides: dict[str, Any] = Field(default_factory=dict)
    # ModelOpt FP8 checkpoints (Cosmos3, docs/generation.md): auto = W8A8 on CUDA with compute
    # capability >= 8.9, else W8A16 (dequantised once at load); w8a8 where it cannot run fails.
    fp8_compute: Literal["auto", "w8a16", "w8a8"] = "auto"

    def quant_options(self) -> dict[str, str]:
        """Loader keyword arguments for quantised checkpoints: none at the default, so that a
        family without FP8 support is only handed `fp8_compute` when it was asked for."""
        return {} if self.fp8_compute == "auto" else {"fp8_compute": self.fp8_compute}

    @field_validator("device")
    @classmethod
    def _device_is_known(cls, device: str) -> str:
        return check_device_name(device.strip().lower())

    @field_validator("host")
    @classmethod
    def _host_is_loopback(cls, host: str) -> str:
        if not is_loopback_host(host):
            raise ValueError(f"stage sockets bind loopback only; got {host!r} (use 127.0.0.1)")
        return host

    @model_validator(mode="before")
    @classmethod
    def _known_overrides_only(cls, data: Any) -> Any:
        return _lift_overrides(data, cls.LIFTED_OVERRIDES, cls.ACCEPTED_OVERRIDES)

    @field_validator("server_args_overrides")
    @classmethod
    def _override_host_is_loopback(cls, overrides: dict[str, Any]) -> dict[str, Any]:
        # Exactly 127.0.0.1 (native-media spec 1.3): `localhost` or `::` may resolve elsewhere.
        host = overrides.get("host")
        if host is not None and host != "127.0.0.1":
            raise ValueError(f"host: stage sockets bind 127.0.0.1 only; got {host!r}")
        return overrides


PARALLEL_AXES = ("cfg", "ulysses", "ring", "shard")


class GenerationParallelConfig(_Frozen):
    """One request across several ranks (docs/parallel.md): cfg x ulysses x ring ranks
    compute, `shard` splits the transformer blocks' weights (a group of max(cfg x ulysses x
    ring, shard) ranks, one device each). Also written `cfg=2,ulysses=2` (the
    `--generation-parallel` flag)."""

    cfg: int = Field(default=1, ge=1, le=2)  # 2: cond and uncond forwards on two ranks
    ulysses: int = Field(default=1, ge=1, le=64)  # sequence parallel, all-to-all over heads
    ring: int = Field(default=1, ge=1, le=64)  # sequence parallel, ring over sequence chunks
    shard: int = Field(default=1, ge=1, le=64)  # ranks sharing one copy of the block weights
    vae: bool = True  # split the VAE decode across the ranks (strips of latent rows)
    # A collective or a peer's answer slower than this fails the group (never a hang).
    timeout_s: float = Field(default=300.0, gt=0, le=86_400)

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, data: Any) -> Any:
        if not isinstance(data, str):
            return data
        out: dict[str, Any] = {}
        for item in filter(None, (part.strip() for part in data.split(","))):
            key, sep, value = item.partition("=")
            if not sep or key.strip() not in (*PARALLEL_AXES, "vae", "timeout_s"):
                raise ValueError(f"{item!r} is not AXIS=N (axes: {', '.join(PARALLEL_AXES)}; "
                                 f"e.g. cfg=2,ulysses=2)")
            out[key.strip()] = value.strip()
        return out

    @model_validator(mode="after")
    def _group_is_whole(self) -> GenerationParallelConfig:
        compute = self.cfg * self.ulysses * self.ring
        big, small = max(compute, self.shard), min(compute, self.shard)
        if big % small:
            raise ValueError(f"shard={self.shard} and cfg x ulysses x ring = {compute}: one "
                             f"must be a multiple of the other")
        return self

    @property
    def world_size(self) -> int:
        return max(self.cfg * self.ulysses * self.ring, self.shard)


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


class StepCacheConfig(_Frozen):
    """Step caching on the generation transformer (docs/generation.md, "Step caching"): the
    diffusers cache hooks are installed at startup when the model's family declares support;
    a request caches when it sends `enable_teacache: true`, or, with `default: true`, unless it
    sends `enable_teacache: false`."""

    enabled: bool = True  # false: no hooks; enable_teacache: true is a 400
    method: Literal["seacache", "taylorseer"] = "seacache"
    threshold: float | None = Field(default=None, ge=0, le=10)  # None: the method's default
    interval: int | None = Field(default=None, ge=1, le=100)  # taylorseer: full-forward period
    default: bool = False  # requests that omit enable_teacache cache too

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

    output_dir: Path = Path("outputs")
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
    # One request across several ranks (docs/parallel.md); the default is one process.
    parallel: GenerationParallelConfig = Field(default_factory=GenerationParallelConfig)
    # The transformer's attention kernel (diffusers' `set_attention_backend`); "native" is
    # diffusers' default dispatch (torch SDPA). A backend this machine cannot run fails startup.
    attention_backend: str = "native"
    # torch.compile the transformer's repeated blocks (dynamic shapes) during warmup.
    compile: bool = False
    # Cosmos3: record the understanding (text) stream's K/V at a row's first step and reuse it
    # at later steps (bit-exact; stands aside for rows that cache steps).
    understanding_kv_reuse: bool = True

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
    vae_tiling: bool = False
    vae_tile_size: int | None = Field(default=None, ge=32, le=8192)
    vae_tile_stride: int | None = Field(default=None, ge=16, le=8192)
    vae_decode_chunk_frames: int = Field(default=0, ge=0, le=1024)

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


class StreamingConfig(_Frozen):
    """Live video reasoning sessions (spec streaming-reasoning.md section 2)."""

    enabled: bool = True
    max_sessions: int = Field(default=2, ge=1, le=1024)
    max_video_segments: int = Field(default=8, ge=1)
    idle_timeout_s: float = Field(default=900.0, gt=0)
    rest_idle_timeout_s: float = Field(default=120.0, gt=0)
    frame_timeout_s: float = Field(default=120.0, gt=0)
    # None: 2 x max_sessions x max_video_segments (never below that floor)
    image_budget: int | None = Field(default=None, ge=1)
    encoder_capacity: int | None = Field(default=None, ge=1)
    # A DFlash drafter directory (transformers' muse_glimmer_assistant, z-lab's DFlashDraftModel
    # or a speculators `dflash` checkpoint); declared before spec_method, whose validator needs it.
    spec_model_path: Path | None = None
    # None: dflash when a drafter is given, else none.
    spec_method: Literal["none", "ngram", "dflash"] | None = Field(default=None,
                                                                   validate_default=True)
    # Drafts per step, both methods (dflash: also at most the drafter's block_size - 1).
    spec_num_tokens: int = Field(default=3, ge=1, le=16)
    # None: the library default (7000), lowered to fit small models (A1/A2 of spec 4.5)
    max_session_tokens: int | None = Field(default=None, ge=1024)
    # How often the api's reaper closes idle sessions (spec section 6.1: every 5 s).
    reaper_interval_s: float = Field(default=5.0, gt=0, le=60)

    @field_validator("spec_method")
    @classmethod
    def _dflash_has_a_drafter(cls, method: str | None, info: ValidationInfo) -> str:
        if method is None:
            return "none" if info.data.get("spec_model_path") is None else "dflash"
        if method == "dflash" and info.data.get("spec_model_path") is None:
            raise ValueError("'dflash' needs a drafter directory: set streaming.spec_model_path "
                             "(--streaming-spec-model-path)")
        return method


class ReasonerStageConfig(StageConfig):
    """Vision-language reasoning: live video sessions and chat completions."""

    # `hf`: transformers (CPU and GPU); `fake`: deterministic replies for contract tests.
    backend: Literal["hf", "fake"] = "hf"
    streaming: StreamingConfig = Field(default_factory=StreamingConfig)
    # None: the model's max_position_embeddings
    max_model_len: int | None = Field(default=None, ge=256)
    # Upper bound of tokens prefilled in one engine step (a frame's chunk is never split).
    max_prefill_tokens: int = Field(default=2048, ge=64)
    # Batch the decode steps of concurrent sessions into one forward.
    batch_decode: bool = True
    # Decode steps through the family's static decode step (fewer host ops than transformers'
    # forward, token-identical; families without one keep transformers' forward).
    static_decode: bool = True
    # torch.compile the static decode step (CUDA: CUDA graphs). Off: not verified on a GPU.
    compile_decode: bool = False
    # Run in the generation stage's process (same device): a Cosmos3 directory's reasoner then
    # shares the generator's understanding weights instead of holding a second copy.
    colocate_with_generation: bool = False
    # Colocated only: where the generation forward lets the reasoner run. `blocks`: before
    # every transformer block, while the reasoner has work, for at most
    # `colocation_max_yield_ms` per block; `steps`: between whole engine steps only (one
    # reasoner step per generation step). docs/reasoner-engine.md, benchmarks/colocation.py.
    colocation_yield: Literal["blocks", "steps"] = "blocks"
    colocation_max_yield_ms: float = Field(default=250.0, gt=0, le=60_000)
    # Grammar engine of guided_json/guided_choice/guided_regex: the hf and fake backends use
    # llguidance; xgrammar/auto name the NIM's vllm backend and are refused here.
    guided_decoding_backend: Literal["llguidance", "xgrammar", "auto"] = "llguidance"
    # `fake` backend only (protocol tests): delay of every reply, a 0-based frame index that is
    # never answered (frame timeouts), one that fails as an engine error, and whether the
    # backend claims streaming support (False: streaming routes answer 501); how long loading
    # takes (start-up probes, api/startup.py).
    fake_delay_ms: float = Field(default=0.0, ge=0, le=60_000)
    fake_load_delay_s: float = Field(default=0.0, ge=0, le=600)
    fake_hang_on_frame: int | None = Field(default=None, ge=0)
    fake_fail_on_frame: int | None = Field(default=None, ge=0)
    fake_streaming: bool = True

    @field_validator("streaming")
    @classmethod
    def _spec_method_is_served(cls, streaming: StreamingConfig,
                               info: ValidationInfo) -> StreamingConfig:
        backend = info.data.get("backend", "hf")
        if streaming.spec_method == "dflash" and backend != "hf":
            raise ValueError(f"spec_method 'dflash' needs the hf backend (this stage uses "
                             f"{backend!r})")
        return streaming

    @field_validator("guided_decoding_backend")
    @classmethod
    def _guided_backend_is_served(cls, name: str, info: ValidationInfo) -> str:
        if name != "llguidance":
            backend = info.data.get("backend", "hf")
            raise ValueError(f"{name!r} needs the NIM's vllm backend; the {backend} backend "
                             f"supports 'llguidance'")
        return name


class RealtimeStageConfig(StageConfig):
    """Realtime world exploration (causal video model), a stage of its own."""

    LIFTED_OVERRIDES: ClassVar[dict[str, str]] = {
        "warmup_mode": "warmup_mode", "warmup_resolutions": "warmup_sizes"}
    # The fake backend's test knobs (engines/realtime/fake.py).
    ACCEPTED_OVERRIDES: ClassVar[frozenset[str]] = frozenset({
        "host", "frames_per_chunk", "min_pulse_items", "fake_forward_ms", "fake_camera",
        "fake_realtime_supported", "fake_lose_session_seed"})

    # `causal`: the causal video diffusion model; `fake`: synthetic frames for protocol tests.
    backend: Literal["causal", "fake"] = "causal"
    max_sessions: int = Field(default=2, ge=1, le=64)
    admission_wait_s: float = Field(default=10.0, ge=0)
    max_sessions_per_user: int = Field(default=0, ge=0)
    idle_timeout_s: float = Field(default=300.0, gt=0)
    max_lifetime_s: float = Field(default=0.0, ge=0)
    # Api side of the WebSocket: how long a socket may go without a valid init, and how long
    # one chunk may take in the stage before the session fails.
    init_timeout_s: float = Field(default=60.0, gt=0)
    chunk_timeout_s: float = Field(default=300.0, gt=0)
    # 0 = off. Else a session is admitted only while the estimated KV bytes of all sessions
    # (engine `kv_bytes_per_token` x window x tokens per frame) stay within this budget.
    kv_budget_gib: float = Field(default=0.0, ge=0)
    # Model (engine) settings. None: the checkpoint's default (realtime_config.json). Frame
    # counts are latent frames; sessions may override sink/window within the bounds of
    # spec realtime-video.md section 6.3.
    sink_frames: int | None = Field(default=None, ge=0)
    window_frames: int | None = Field(default=None, ge=1)
    frames_per_block: int | None = Field(default=None, ge=1, le=16)
    num_inference_steps: int | None = Field(default=None, ge=1, le=50)
    max_inference_steps: int = Field(default=16, ge=1, le=100)
    max_width: int = Field(default=1280, ge=16)
    max_height: int = Field(default=1280, ge=16)
    # Session table bound = max_sessions + this margin (LRU safety net for lost releases).
    session_table_margin: int = Field(default=2, ge=0, le=64)
    # With warmup_mode "server": "WxH" sizes of the synthetic warm-up sessions (spec section 9);
    # None: the checkpoint's default size.
    warmup_sizes: list[str] | None = None

    @model_validator(mode="after")
    def _fake_knobs_need_the_fake_backend(self) -> "RealtimeStageConfig":
        knobs = sorted(set(self.server_args_overrides) - {"host"})
        if knobs and self.backend != "fake":
            raise ValueError(f"server_args_overrides.{knobs[0]}: only the fake backend reads "
                             f"it (backend is {self.backend!r})")
        return self

    @field_validator("warmup_sizes")
    @classmethod
    def _sizes_are_wxh(cls, sizes: list[str] | None) -> list[str] | None:
        for size in sizes or []:
            parts = size.split("x")
            if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
                raise ValueError(f"warm-up size {size!r} is not WxH (e.g. 832x480)")
        return sizes


class StagesConfig(_Frozen):
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


class ServerConfig(_Frozen):
    """The whole server. Secrets (the admin key, the API key) are not part of it."""

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
    # Responses show absolute server paths (`file_path(s)`, /v1/models `root`, action metadata
    # `model_path`, NIM `modelUrl`) only when the operator asks (--show-server-paths).
    show_server_paths: bool = False
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


def format_validation_error(err: ValidationError, sources: dict[str, str] | None = None) -> str:
    """One line per problem: `<dotted.path>: <message>`, plus `(from $VAR)` where an
    environment variable set the key."""
    lines = []
    for item in err.errors():
        path = ".".join(str(p) for p in item["loc"]) or "<root>"
        msg = item["msg"].removeprefix("Value error, ")
        source = (sources or {}).get(path)
        lines.append(f"{path}: {msg}" + (f" (from ${source})" if source else ""))
    return "; ".join(lines)


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        raise ConfigError(f"config file {path} is not valid YAML{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    node = tree
    *parents, leaf = dotted.split(".")
    for key in parents:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{key}: expected a mapping, got {type(child).__name__}")
        node = child
    node[leaf] = value


def build_config(data: dict[str, Any], overrides: dict[str, Any] | None = None) -> ServerConfig:
    """Validate `data` (YAML) with the environment's settings and then the dotted-path
    `overrides` (CLI flags) applied on top: flag > environment > YAML > default."""
    tree = dict(data)
    try:
        from_env = envs.config_settings()
    except envs.EnvSettingError as exc:
        raise ConfigError(f"invalid environment: {exc}") from None
    sources: dict[str, str] = {}
    for dotted, (value, variable) in from_env.items():
        _set_dotted(tree, dotted, value)
        sources[dotted] = variable
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(tree, dotted, value)
            sources.pop(dotted, None)
    try:
        return ServerConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(
            f"invalid configuration: {format_validation_error(exc, sources)}"
        ) from None


def load_config(path: Path | None, overrides: dict[str, Any] | None = None) -> ServerConfig:
    return build_config(read_yaml(path) if path else {}, overrides)
