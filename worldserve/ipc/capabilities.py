"""What each stage kind declares to the api at startup (`StageInfo.capabilities`), typed.

One msgspec Struct per stage kind, tagged by `kind` so `StageInfo` decodes the right one. Every
field has a default, and that default is the only one: the api reads fields, never keys, and
falls back to `Kind()` when a stage has not said hello yet. To add a fact (e.g.
`supports_sound`), add a field with a default here and set it in the engine's `capabilities()`;
older engines keep decoding.

`ReasonerRetention` and `ReasonerSampling` live here because the reasoner's capabilities carry
them as its defaults; `worldserve.ipc.messages` re-exports both.
"""

from __future__ import annotations

from typing import TypeVar, Union

import msgspec


class ReasonerRetention(msgspec.Struct, kw_only=True):
    """Effective retention of one session (spec section 4.2)."""

    max_video_segments: int = 30
    max_text_tokens: int | None = None
    max_session_tokens: int = 7000
    eviction_policy: str = "sliding_window"
    reprefill_threshold: float = 0.7


class ReasonerSampling(msgspec.Struct, kw_only=True):
    """Effective sampling (spec section 4.3); `guided_json` is the schema as JSON text."""

    max_tokens: int = 24
    temperature: float = 0.3
    top_p: float = 0.9
    repetition_penalty: float = 1.1
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    top_k: int = -1
    seed: int | None = None
    stop: list[str] | None = None
    guided_json: str | None = None
    guided_choice: list[str] | None = None
    guided_regex: str | None = None


class StageCapabilities(msgspec.Struct, kw_only=True, tag_field="kind"):
    """Base of the per-kind capability structs (never sent itself)."""


# --------------------------------------------------------------------------- generation


class GenerationDefaults(msgspec.Struct, kw_only=True):
    """Sampling defaults the api fills omitted request fields from (Wan 2.1/2.2 at 480p)."""

    width: int = 832
    height: int = 480
    num_frames: int = 81
    fps: int = 16
    num_inference_steps: int = 50
    guidance_scale: float = 5.0
    negative_prompt: str = ""
    seed: int = 42
    max_sequence_length: int = 512
    image_width: int = 832
    image_height: int = 480
    image_format: str = "png"


class ActionHeadCapabilities(msgspec.Struct, kw_only=True):
    """The action head's shapes (`GET /v1/actions/metadata`)."""

    action_horizon: int
    action_dim: int
    state_dim: int
    image_size: int
    max_images: int
    num_inference_steps: int
    max_candidates: int


class GenerationCapabilities(StageCapabilities, tag="generation"):
    pipeline: str = "unknown"
    defaults: GenerationDefaults = msgspec.field(default_factory=GenerationDefaults)
    size_multiple: int = 16
    temporal_stride: int = 4
    max_batch_size: int = 1
    image_conditioning: bool = True
    max_input_images: int = 4
    output_dir: str = ""
    # None: the checkpoint has no action_head/ folder (actions routes answer 404).
    actions: ActionHeadCapabilities | None = None


# --------------------------------------------------------------------------- reasoner


class ReasonerCapabilities(StageCapabilities, tag="reasoner"):
    backend: str = "hf"
    streaming: bool = False
    chat: bool = True
    # Server policy for sessions that omit `retention`; `library_retention` is the base that
    # supplied fields are merged onto (None: ReasonerRetention's own defaults).
    retention: ReasonerRetention = msgspec.field(default_factory=ReasonerRetention)
    library_retention: ReasonerRetention | None = None
    sampling: ReasonerSampling = msgspec.field(default_factory=ReasonerSampling)
    max_sessions: int | None = None
    image_budget: int | None = None
    encoder_capacity: int | None = None
    architecture: str = ""
    dtype: str = ""
    max_model_len: int | None = None
    max_position_embeddings: int | None = None
    spec_method: str | None = None
    spec_num_tokens: int | None = None
    guided_decoding_backend: str | None = None


# --------------------------------------------------------------------------- realtime


class RealtimeCapabilities(StageCapabilities, tag="realtime"):
    pipeline: str = "unknown"
    realtime_supported: bool = False
    frames_per_chunk: int = 12
    first_chunk_frames: int | None = None  # None: same as frames_per_chunk
    latent_frames_per_block: int = 3
    temporal_upsampling: int = 4
    default_fps: int = 16
    default_width: int = 832
    default_height: int = 480
    default_num_inference_steps: int | None = None
    max_inference_steps: int | None = None
    default_sink_frames: int | None = None
    default_window_frames: int | None = None
    max_window_frames: int | None = None
    camera_conditioning: bool = False
    camera_keys: str = "wasdijkl"
    supports_first_frame: bool = False
    requires_first_frame: bool = False  # sessions start from an image (e.g. SANA-WM)
    supports_guidance: bool = True
    max_script_frames: int = 512
    min_pulse_items: int = 1
    max_width: int = 4096
    max_height: int = 4096
    size_multiple: int = 1
    # KV estimate for admission (spec 7.1): bytes = kv_bytes_per_token x window x
    # (width / size_multiple) x (height / size_multiple).
    kv_bytes_per_token: int = 0

    def frames_in_chunk(self, chunk_index: int) -> int:
        if chunk_index == 0 and self.first_chunk_frames is not None:
            return self.first_chunk_frames
        return self.frames_per_chunk

    def kv_bytes(self, width: int, height: int, window_frames: int | None) -> int:
        """Estimated KV cache of one session (spec §7.1): bytes per token x window x tokens."""
        window = window_frames or self.default_window_frames or 0
        side = max(1, self.size_multiple)
        return self.kv_bytes_per_token * window * (width // side) * (height // side)


Capabilities = Union[GenerationCapabilities, ReasonerCapabilities, RealtimeCapabilities]
C = TypeVar("C", GenerationCapabilities, ReasonerCapabilities, RealtimeCapabilities)


def capabilities_as(caps: Capabilities | None, kind: type[C]) -> C:
    """`caps` as `kind`; `kind()` (the declared defaults) when the stage has not said hello."""
    if caps is None:
        return kind()
    if not isinstance(caps, kind):
        raise TypeError(f"expected {kind.__name__}, the stage declared {type(caps).__name__}")
    return caps
