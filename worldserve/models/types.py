"""Types both sides of the runner contracts share (engines and model families). No torch here:
the registry and the engines' contracts import this module."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from worldserve.ipc.capabilities import ActionGenerationCapabilities, GenerationDefaults


class ModelLoadError(RuntimeError):
    """The stage's model directory is missing, unreadable or of no supported family (the
    message names the path and what was found)."""


@dataclass(frozen=True)
class WorldSessionSettings:
    """A realtime world session's settings, fixed at chunk 0. Frame counts are latent frames."""

    seed: int
    width: int
    height: int
    num_inference_steps: int
    sink_frames: int
    window_frames: int
    frames_per_block: int
    guidance_scale: float = 1.0
    negative_prompt: str = ""
    first_frame: bytes | None = None  # encoded image (PNG/JPEG/...), validated by the runner
    intrinsics: tuple[float, ...] | None = None  # [fx, fy, cx, cy] in first_frame pixels


FIRST_FRAME_MODES = ("unsupported", "optional", "required")


@dataclass(frozen=True)
class RealtimeModelFacts:
    """What a realtime runner's checkpoint tells the engine (defaults, limits, controls).

    Frame counts are latent frames. `first_frame`: whether an init may / must carry an image.
    `guidance`: whether guidance_scale != 1 is accepted (False: distilled without CFG, refused
    with a clear message). `kv_bytes_per_token` feeds the api's admission estimate (spec 7.1).
    """

    pipeline: str
    frames_per_block: int
    default_sink_frames: int
    default_window_frames: int
    max_window_frames: int
    default_num_inference_steps: int
    default_fps: int
    default_width: int
    default_height: int
    size_multiple: int
    max_script_frames: int = 512
    min_pulse_items: int = 1
    kv_bytes_per_token: int = 0
    camera_keys: str = "wasdijkl"
    camera_conditioning: bool = True
    first_frame: str = "unsupported"
    guidance: bool = False


class WorldSessionState(enum.Enum):
    ACTIVE = "active"
    RELEASED = "released"


@dataclass
class ChunkRunOutput:
    """What a realtime runner returns for one chunk of one session."""

    frames: bytes  # num_frames raw RGB24 frames, concatenated
    num_frames: int
    forward_ms: float  # whole chunk: refresh + denoise + context pass + decode
    kv_refresh_ms: float | None
    latents: Any  # torch.Tensor (1, C, F, h, w): the block's clean latents
    dit_ms: float = 0.0  # denoising steps + context pass
    decode_ms: float = 0.0


@dataclass(frozen=True)
class ModelFamily:
    """One architecture the server can run: how to recognise its directory and, per stage kind,
    the `module:function` that loads a runner for it (imported only when used)."""

    name: str  # "wan"
    detect: Callable[[Path], bool]  # cheap: reads JSON files only, never imports torch
    loaders: Mapping[str, str]  # stage kind -> "module:function"
    # Stage kinds served only when that stage's model_path names the directory (never chosen by
    # `--model-path DIR` detection): a Cosmos3 directory is a realtime model only on request.
    explicit_kinds: frozenset[str] = frozenset()
    # stage kind -> "module:function" `(model_dir, dtype) -> ModelProfile` (file reads only);
    # a kind without one has no NIM profile (variant None, precision = the serving dtype).
    profiles: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # The diffusers attention backends (`stages.generation.attention_backend`) the family's
    # transformer is correct with; None: any. Others are a startup error before loading.
    attention_backends: frozenset[str] | None = None


DTYPE_PRECISION = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


@dataclass(frozen=True)
class ModelProfile:
    """A checkpoint in the NIM's terms (cookbook support-matrix.md): `variant` (nano, super,
    edge, nano-droid, super-t2i, super-i2v-4step, ...; None: no NIM variant), `precision` (fp8,
    nvfp4, bf16, fp16, fp32) and, for a specialist, the only `model_modes` it serves."""

    variant: str | None
    precision: str
    model_modes: tuple[str, ...] | None = None

    @classmethod
    def plain(cls, dtype: str) -> "ModelProfile":
        return cls(variant=None, precision=DTYPE_PRECISION.get(dtype, dtype))


@dataclass
class VisionInput:
    """One preprocessed image or video clip for a vision-language model.

    `payload` is the family's own processor output (pixel patches, grids, timestamps...): only
    the family that made it reads it. The engine knows the kind and how many placeholder tokens
    the item takes in the prompt, nothing else.
    """

    kind: Literal["image", "video"]
    payload: Any
    num_tokens: int


@dataclass
class RowExtras:
    """What a generation runner produces for one output row besides its frames: a waveform
    (channels, samples) float in [-1, 1] at `sample_rate`, and predicted actions
    (horizon, raw_action_dim) with their mode and domain."""

    audio: Any = None
    sample_rate: int | None = None
    action: Any = None
    action_mode: str | None = None
    domain_id: int | None = None


@dataclass(frozen=True)
class RunnerFeatures:
    """What a generation runner's checkpoint declares: its family's name (information only),
    the sampling defaults of this checkpoint (the family's real or dev ones, from
    `models/<family>/family.py` through `models.dev.checkpoint_defaults`), and what it can do
    beyond plain text-to-image/video. The engine copies it into the stage's capabilities; the
    api fills omitted fields from `defaults` and validates requests against the rest."""

    family: str
    defaults: GenerationDefaults
    image_edits: bool = True  # /v1/images/edits (Cosmos3: no, condition videos instead)
    exact_num_frames: bool = False  # an explicit num_frames must be 1 mod temporal_stride
    sound: bool = False
    sound_sample_rate: int | None = None
    video_conditioning: bool = False
    action_generation: bool = False
    padded_action_dim: int | None = None
    action_domains: Mapping[str, int] | None = None  # domain name -> raw action width
    action_domain_ids: Mapping[str, int] | None = None  # domain name -> domain id
    flow_shift: bool = False  # a request's `flow_shift` sets its scheduler's shift
    # The actions protocol when the runner itself generates actions ("world_model"); the
    # engine declares "flow_head" for a separate action head (ipc/capabilities.py ActionApi).
    action_api: str | None = None
    action_resolution_tiers: tuple[int, ...] | None = None  # None: the protocol's defaults
    # Step-cache methods the runner can run per request (levers/step_cache.py); (): none, and a
    # request's `enable_teacache: true` is a 400.
    step_cache_methods: tuple[str, ...] = ()


@dataclass(frozen=True)
class StepCacheSettings:
    """A stage's step-cache method and its knob (None: the method's default;
    levers/step_cache.py turns it into diffusers' config)."""

    method: str
    threshold: float | None = None
    interval: int | None = None  # TaylorSeer: a full forward every `interval` steps


@dataclass(frozen=True)
class StepCacheStats:
    """One output row's transformer forwards under step caching, and how many of them reused
    cached work instead of running every block."""

    method: str
    num_forwards: int
    num_forwards_skipped: int


def feature_capabilities(features: RunnerFeatures, *, action_head: bool = False) -> dict[str, Any]:
    """The runner's features as `GenerationCapabilities` fields: what the engine declares to
    the api, and what a runner's own backstop checks (`ipc/rules.py`) read."""
    actions = None
    if features.action_generation and features.padded_action_dim is not None:
        tiers = ({"resolution_tiers": features.action_resolution_tiers}
                 if features.action_resolution_tiers else {})
        actions = ActionGenerationCapabilities(
            padded_action_dim=features.padded_action_dim,
            domains=dict(features.action_domains or {}),
            domain_ids=dict(features.action_domain_ids or {}), **tiers)
    action_api = features.action_api or ("flow_head" if action_head else None)
    return {"family": features.family, "defaults": features.defaults,
            "image_edits": features.image_edits,
            "exact_num_frames": features.exact_num_frames, "sound": features.sound,
            "sound_sample_rate": features.sound_sample_rate,
            "video_conditioning": features.video_conditioning, "action_generation": actions,
            "action_api": action_api, "flow_shift": features.flow_shift,
            "step_cache_methods": tuple(features.step_cache_methods)}
