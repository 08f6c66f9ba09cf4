"""Every message that crosses a process boundary, as msgspec Structs.

Encoded as msgpack with a `type` tag (the class name); never pickle. Field order: msgspec
applies `kw_only` per class, so required fields come before fields with defaults. Every class that
subclasses `Message` in this module is decodable (see `all_message_types()`). Sections:
control (all stages), then one section per engine.

Requests carry a `request_id` chosen by the api process; every reply to a request carries the
same id. A request gets exactly one terminal reply (a result or `ErrorReply`); streaming
requests may get non-terminal replies (progress, chunks) before it.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import msgspec

from worldserve.ipc.capabilities import (  # noqa: F401  (re-exported: session parameters)
    Capabilities,
    ReasonerRetention,
    ReasonerSampling,
)

# `released`: the stage is up but its weights are off the device (POST /admin/memory/release).
StageState = Literal["starting", "loading", "warming", "ready", "released", "failed", "stopped"]


class Message(msgspec.Struct, tag=True, kw_only=True, omit_defaults=True):
    """Base of every cross-process message."""


class Request(Message):
    """A message from the api process that expects replies with the same `request_id`."""

    request_id: str


class Reply(Message):
    """A message from a stage that answers one request.

    `terminal` is False for intermediate replies (progress, chunks) of a streaming request.
    """

    terminal: ClassVar[bool] = True
    request_id: str


# --------------------------------------------------------------------------- control


class Hello(Request):
    """First message of an api client; the stage answers `StageInfo` once its models are loaded."""

    client_id: str


class StageInfo(Reply):
    stage: str
    pid: int
    state: StageState
    model: str
    model_path: str
    num_params: int
    # Engine facts the api needs to answer without a round trip (ipc/capabilities.py).
    capabilities: Capabilities | None = None


class StageStatus(Message):
    """Unsolicited: the stage's state changed (e.g. warming -> ready)."""

    stage: str
    state: StageState
    message: str = ""


class Ping(Request):
    pass


class StatsRequest(Request):
    pass


class StageStats(Reply):
    queue_depth: int
    running: int
    sessions: int = 0
    extra: dict[str, Any] = {}


class Cancel(Request):
    """Cancel the request `target_id` (best effort, at the next step boundary). No reply."""

    target_id: str


class Echo(Request):
    """Relay diagnostic: the stage loop answers with the same payload after `delay_ms`."""

    payload: bytes = b""
    delay_ms: float = 0.0


class EchoReply(Reply):
    payload: bytes = b""


class ErrorReply(Reply):
    """Terminal failure of one request; `code` is an `errors.WorldserveError.code`."""

    code: str
    message: str


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
    """`progress` follows the spec's rule: 1..90 while denoising, 95 decoded, 99 writing."""

    terminal: ClassVar[bool] = False
    progress: int
    steps_done: int
    steps_total: int
    phase: str = "denoising"


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


# --------------------------------------------------------------------------- reasoner
# Contract: shared/spec/streaming-reasoning.md. The api process validates the public schema,
# enforces frame byte/pixel limits and one-frame-in-flight, and owns idle/frame timeouts; the
# reasoner engine owns admission (A1-A3, C1-C2), sessions, retention, decoding.


class CreateSession(Request):
    """Admit and create a live reasoning session. Reply: `SessionCreated` or `ErrorReply`
    (`invalid_request` for A1-A3 / grammar, `capacity_exceeded` for C1-C2)."""

    session_id: str
    system_prompt: str
    retention: ReasonerRetention
    sampling: ReasonerSampling
    question: str = ""


class SessionCreated(Reply):
    session_id: str
    retention: ReasonerRetention
    sampling: ReasonerSampling


class SessionFrame(Request):
    """One encoded JPEG/PNG frame (already checked for size and magic bytes by the api).
    `received_at` is the api's time.time() when the frame was fully received."""

    session_id: str
    image: bytes
    received_at: float


class FrameResult(Reply):
    """The spec's frame reply (section 5.4) minus `op`."""

    frame_index: int
    text: str
    finish_reason: str
    token_count: int
    ttft_s: float | None = None
    latency_s: float | None = None
    decode_ms: float | None = None
    build_ms: float | None = None
    engine_ms: float | None = None
    inqueue_ms: float | None = None
    evicted_segments: int = 0
    reprefill_ms: float | None = None
    session_tokens: int = 0


class CloseSession(Request):
    """Release a session's cache (idempotent). Reply: `SessionClosed` (frames = replies sent)."""

    session_id: str


class SessionClosed(Reply):
    session_id: str
    frames: int


class ChatPart(msgspec.Struct, kw_only=True):
    """`type` is "text" (with `text`), "image" (with encoded `image` bytes) or "video" (a clip:
    `frames`, encoded PNG/JPEG frames sampled `fps` a second by the api)."""

    type: str
    text: str | None = None
    image: bytes | None = None
    frames: list[bytes] = []
    fps: float | None = None


class ChatMessage(msgspec.Struct, kw_only=True):
    role: str
    parts: list[ChatPart]


class ChatCompletion(Request):
    """One-shot chat completion. With `stream`, `ChatDelta` replies precede the `ChatResult`.

    `sampling.max_tokens` larger than the room the prompt leaves in the context is lowered to
    that room (vLLM's rule). `template_kwargs` reach the chat template (`enable_thinking`);
    `thinking_token_budget` closes a reasoning block after that many tokens."""

    messages: list[ChatMessage]
    sampling: ReasonerSampling
    stream: bool = False
    template_kwargs: dict[str, Any] = {}
    thinking_token_budget: int | None = None


class ChatDelta(Reply):
    """New reply text: `text` of the content, `reasoning` of the reasoning block."""

    terminal: ClassVar[bool] = False
    text: str
    reasoning: str = ""


class ChatResult(Reply):
    """`text` is the content; `reasoning` the reasoning block (None: the reply had none)."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    reasoning: str | None = None
    reasoning_tokens: int = 0  # of completion_tokens, those inside the reasoning block


# --------------------------------------------------------------------------- realtime
# Contract: shared/spec/realtime-video.md. The api process owns the WebSocket protocol, control
# queues (script/state/DSL -> one key list per output frame), framing/encoding, pacing and
# admission; the realtime engine owns per-session causal state (KV sink + window, latents,
# streaming VAE decode) and produces raw RGB24 frames chunk by chunk.


class RealtimeOpen(Request):
    """Open (or reset) a session: its settings, sent once, before chunk 0. The engine validates
    them at once (an invalid one is an error reply) and answers `RealtimeOpened`; chunk 0 then
    builds the session's state under them."""

    session_id: str
    prompt: str = ""
    negative_prompt: str | None = None
    seed: int = 42
    width: int = 0
    height: int = 0
    num_inference_steps: int | None = None
    guidance_scale: float = 1.0
    sink_size: int | None = None
    window_frames: int | None = None
    first_frame: bytes | None = None
    # [fx, fy, cx, cy] in first_frame pixels (camera-conditioned image models)
    intrinsics: list[float] | None = None


class RealtimeOpened(Reply):
    session_id: str


class RealtimeChunk(Request):
    """Generate chunk `chunk_index` of an opened session: only what changes per chunk. Chunk 0
    of a session that was not opened, and chunk k > 0 of an unknown session, fail with
    `not_found`. `camera` holds one key list per output frame of this chunk (the actions; None:
    no camera control). `prompt` switches the prompt from this chunk on (on chunk 0 it replaces
    the open's); `refresh_kv` also rebuilds the self-attention cache under it."""

    session_id: str
    chunk_index: int
    prompt: str | None = None
    camera: list[list[str]] | None = None
    refresh_kv: bool = False
    submitted_at: float = 0.0


class RealtimeChunkResult(Reply):
    """`frames`: `num_frames` raw RGB24 frames of `height x width`, concatenated."""

    session_id: str
    chunk_index: int
    frames: bytes
    num_frames: int
    width: int
    height: int
    forward_ms: float
    queue_ms: float = 0.0
    kv_refresh_ms: float | None = None
    cached_frames: int = 0


class RealtimeRelease(Request):
    """Free every state of the session (idempotent). Reply: `RealtimeReleased`."""

    session_id: str


class RealtimeReleased(Reply):
    session_id: str
    existed: bool


def all_message_types() -> tuple[type[Message], ...]:
    """Every concrete message class (every subclass of Message, at any depth)."""
    found: list[type[Message]] = []
    stack = list(Message.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if cls not in (Request, Reply):
            found.append(cls)
    return tuple(found)
