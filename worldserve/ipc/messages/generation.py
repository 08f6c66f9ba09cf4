"""Generation and operator (admin) messages; see the package docstring."""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

from worldserve.ipc.messages.base import (
    Reply,
    Request,
)

# --------------------------------------------------------------------------- generation
# Contract: shared/spec/native-media.md. The api process validates the public schema, applies
# flattening and the media policy, owns job records (SQLite) and output file names; the
# generation engine owns batching, denoising, decoding and writing files under output_dir.


class LoraRef(msgspec.Struct, kw_only=True):
    """One LoRA adapter a request selects; `scale` None = the scale it was loaded with."""

    name: str
    scale: float | None = None
class ActionCondition(msgspec.Struct, kw_only=True):
    """A Cosmos3 action run (`CosmosActionCondition`): the observation is the request's
    `condition_images[0]` (policy, forward_dynamics) or `condition_video` (any mode)."""

    mode: str  # policy | forward_dynamics | inverse_dynamics
    chunk_size: int  # action_horizon; the clip has chunk_size + 1 frames
    domain_name: str
    resolution_tier: int = 480
    view_point: str = "ego_view"
    raw_actions: list[list[float]] | None = None  # forward_dynamics: [T][raw_action_dim]


class GenerationParams(msgspec.Struct, kw_only=True):
    """Resolved sampling parameters of one generation request (every field explicit).

    `num_frames` 1 is an image. `condition_images` are encoded image files (PNG/JPEG/WebP);
    their presence makes the request image-conditioned (never batched with others).
    `condition_video` (an encoded video file) and `action` condition a request likewise.
    Models that do not declare a field never see it set (the api refuses it first).
    """

    prompt: str
    width: int
    height: int
    num_frames: int
    num_inference_steps: int
    guidance_scale: float
    seeds: list[int]
    negative_prompt: str = ""
    guidance_scale_2: float | None = None
    condition_images: list[bytes] = []
    strength: float = 0.7
    max_sequence_length: int | None = None
    # LoRA adapters active for this request (loaded with POST /admin/lora/load); [] = the base
    # model. Requests with different selections never share a batch.
    lora: list[LoraRef] = []
    fps: float | None = None  # models whose sampling depends on it (Cosmos3)
    flow_shift: float | None = None  # None: the scheduler's configured shift (declared: caps)
    generate_sound: bool = False
    condition_video: bytes | None = None
    condition_frame_indexes_vision: list[int] | None = None
    condition_video_keep: str | None = None  # first | last
    action: ActionCondition | None = None
    # Step caching (SGLang's `enable_teacache`): None = the stage's default
    # (stages.generation.step_cache.default), True / False = this request's choice.
    step_cache: bool | None = None


class GenerateMedia(Request):
    """Generate `len(params.seeds)` outputs and write them as `<output_stem>[_i].<ext>` under
    the stage's output directory. `output_format` is png|jpeg|webp for images, mp4 for videos.

    Replies: `GenerationAccepted` (non-terminal, right after validation), `GenerationProgress`
    (non-terminal, after every denoising step and phase), then `GenerationResult`,
    `GenerationCancelled` or `ErrorReply`."""

    params: GenerationParams
    output_stem: str
    output_format: str
    fps: int = 24
    compression: int = 75


class GenerationAccepted(Reply):
    terminal: ClassVar[bool] = False
    num_frames: int
    width: int
    height: int
    queue_position: int = 0


class GenerationProgress(Reply):
    """Where a request is (engines/generation/progress.py). `phase`: `queued` while it waits
    in the engine (`queue_position` requests ahead of it, sent whenever that changes), `encode`
    once the engine admits it into a batch (progress 0), then `denoise` (1..90, `steps_done` of
    `steps_total`), `decode`, and `mux` (95 decoded, 99 writing the files)."""

    terminal: ClassVar[bool] = False
    progress: int
    steps_done: int
    steps_total: int
    phase: str = "denoise"
    queue_position: int | None = None  # phase `queued` only


class ActionOutput(msgspec.Struct, kw_only=True):
    """Predicted actions of one output: float32 C-order bytes of `shape`."""

    values: bytes
    shape: list[int]
    action_mode: str
    domain_id: int | None = None


class StepCacheReport(msgspec.Struct, kw_only=True):
    """Step caching of one request: its transformer forwards over all its outputs, and how many
    of them reused cached work instead of running every block."""

    method: str
    num_forwards: int
    num_forwards_skipped: int


class GenerationResult(Reply):
    """`stage_durations`: seconds per phase (encode: prompts and latents; denoise; decode; mux:
    writing the files), wall time of the steps the request was in (a batch's steps count for
    each of its requests)."""

    file_names: list[str]
    width: int
    height: int
    num_frames: int
    inference_time_s: float
    peak_memory_mb: float | None = None
    stage_durations: dict[str, float] = {}
    actions: list[ActionOutput] = []  # one per output, for action runs that predict actions
    step_cache: StepCacheReport | None = None  # None: the request did not cache


class GenerationCancelled(Reply):
    """The request stopped at a step boundary; nothing of it runs or is written any more."""

    files_removed: int = 0


class GenerateActions(Request):
    """Predict `action_horizon x action_dim` actions from observation images, state and task.

    `images` are encoded image files; `state` is float32 bytes; `noise` optional float32 bytes."""

    task: str = ""
    images: list[bytes] = []
    state: bytes = b""
    noise: bytes = b""
    num_inference_steps: int | None = None
    action_horizon: int | None = None
    seed: int = 42
    num_candidates: int = 1
    lora: list[LoraRef] = []


class ActionsResult(Reply):
    """`values`: float32 C-order bytes of shape (num_candidates, action_horizon, action_dim)."""

    values: bytes
    num_candidates: int
    action_horizon: int
    action_dim: int
    num_inference_steps: int
    infer_ms: float


# --------------------------------------------------------------------------- admin
# Operator operations on a stage's model (POST /admin/...), relayed to the stage that owns the
# model. The engine applies them between two steps; each gets one `AdminResult` or `ErrorReply`.


class AdminRequest(Request):
    """Base of the operator operations (the stage loop hands them to the engine)."""


class ModelInfoRequest(AdminRequest):
    pass


class LoraLoad(AdminRequest):
    """Load the adapter at `path` (a diffusers/PEFT LoRA directory or .safetensors file)."""

    name: str
    path: str
    scale: float = 1.0
    path_2: str | None = None  # Wan 2.2 A14B: the adapter's file for the low-noise expert


class LoraUnload(AdminRequest):
    name: str


class LoraList(AdminRequest):
    pass


class WeightsUpdate(AdminRequest):
    """Swap in weights of the same architecture from the directory `path`."""

    path: str


class MemoryRelease(AdminRequest):
    pass


class MemoryResume(AdminRequest):
    pass


class GenerationPause(AdminRequest):
    pass


class GenerationContinue(AdminRequest):
    pass


class AdminResult(Reply):
    """The operation's JSON-ready outcome (what the admin route answers)."""

    data: dict[str, Any] = {}


