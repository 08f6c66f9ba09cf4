"""Reasoner messages: live sessions and chat; see the package docstring."""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

from worldserve.ipc.capabilities import ReasonerRetention, ReasonerSampling
from worldserve.ipc.messages.base import (
    Reply,
    Request,
)

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


