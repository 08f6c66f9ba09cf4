"""The reasoner stage: live video reasoning sessions (the NIM streaming settings), chat
completions, the decode levers and colocation with the generator."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from worldserve.config.base import FrozenConfig
from worldserve.config.loading import StageConfig


class StreamingConfig(FrozenConfig):
    """Live video reasoning sessions (spec streaming-reasoning.md section 2)."""

    enabled: bool = Field(default=True, description=(
        "Streaming routes on/off (off: they answer 404, chat is still served)."))
    max_sessions: int = Field(default=2, ge=1, le=1024, description=(
        "Live sessions, WebSocket and REST."))
    max_video_segments: int = Field(default=8, ge=1, description="Default retained frames.")
    idle_timeout_s: float = Field(default=900.0, gt=0, description=(
        "WebSocket session idle timeout in seconds."))
    rest_idle_timeout_s: float = Field(default=120.0, gt=0, description=(
        "REST session idle timeout in seconds."))
    frame_timeout_s: float = Field(default=120.0, gt=0, description=(
        "Per-frame ceiling in seconds."))
    # None: 2 x max_sessions x max_video_segments (never below that floor)
    image_budget: int | None = Field(default=None, ge=1, description=(
        "Per-session image limit, never below 2 x sessions x segments."))
    encoder_capacity: int | None = Field(default=None, ge=1, description=(
        "Shared encoder capacity."))
    # Transformers' muse_glimmer_assistant, z-lab's DFlashDraftModel or a speculators `dflash`
    # checkpoint; declared before spec_method, whose validator needs it.
    spec_model_path: Path | None = Field(default=None, description=(
        "DFlash drafter directory (needed by spec method dflash)."))
    # None: dflash when a drafter is given, else none.
    spec_method: Literal["none", "ngram", "dflash"] | None = Field(
        default=None, validate_default=True, description="Speculative decoding method.")
    # dflash: also at most the drafter's block_size - 1.
    spec_num_tokens: int = Field(default=3, ge=1, le=16, description=(
        "Draft tokens per step."))
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
    batch_decode: bool = Field(default=True, description=(
        "Batch the decode steps of concurrent sessions into one forward."))
    # Families without a static decode step keep transformers' forward.
    static_decode: bool = Field(default=True, description=(
        "Decode through the family's static decode step (fewer host ops, token-identical)."))
    # Off by default: not verified on a GPU.
    compile_decode: bool = Field(default=False, description=(
        "torch.compile the static decode step (on CUDA: no CUDA graphs, see cuda_graphs)."))
    # Off by default: not verified on a GPU (models/qwen_vl/graphs.py).
    cuda_graphs: bool = Field(default=False, description=(
        "Capture the static decode step as CUDA graphs, one per batch, width and cache "
        "buffers, and replay them (unverified: no GPU ran it)."))
    colocate_with_generation: bool = Field(default=False, description=(
        "Run the reasoner in the generation stage's process, sharing a Cosmos3 "
        "directory's understanding weights instead of a second copy."))
    # docs/reasoner-engine.md, benchmarks/colocation.py.
    colocation_yield: Literal["blocks", "steps"] = Field(default="blocks", description=(
        "Colocated: where the generation forward lets the reasoner run, before every "
        "transformer block or between whole engine steps."))
    colocation_max_yield_ms: float = Field(default=250.0, gt=0, le=60_000, description=(
        "Colocated, blocks: the longest the reasoner runs before one transformer block."))
    # xgrammar/auto name the NIM's vllm backend and are refused here.
    guided_decoding_backend: Literal["llguidance", "xgrammar", "auto"] = Field(
        default="llguidance", description=(
            "Grammar engine of guided_json/guided_choice/guided_regex (llguidance)."))
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

    @field_validator("cuda_graphs")
    @classmethod
    def _graphs_capture_the_static_step(cls, graphs: bool, info: ValidationInfo) -> bool:
        if graphs and not info.data.get("static_decode", True):
            raise ValueError("cuda_graphs captures the static decode step: it needs "
                             "static_decode")
        if graphs and info.data.get("compile_decode"):
            raise ValueError("cuda_graphs and compile_decode: choose one (the compiled step "
                             "is not captured)")
        return graphs

    @field_validator("guided_decoding_backend")
    @classmethod
    def _guided_backend_is_served(cls, name: str, info: ValidationInfo) -> str:
        if name != "llguidance":
            backend = info.data.get("backend", "hf")
            raise ValueError(f"{name!r} needs the NIM's vllm backend; the {backend} backend "
                             f"supports 'llguidance'")
        return name


