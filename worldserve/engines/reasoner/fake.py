"""`fake` reasoner backend: deterministic replies behind the real session interface.

It speaks the same messages as the `hf` engine and applies the same admission code (spec
streaming-reasoning.md sections 4.5-4.6) with the same messages, so that protocol tests are fast
and exact. A frame's text is derived from a hash of its bytes and its index; a chat reply from a
hash of the conversation. Configurable through `ReasonerStageConfig.fake_*`: a delay for every
reply, a frame index that is never answered (frame timeouts) and one that fails as an engine
error.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import time
from dataclasses import dataclass
from typing import Any

import msgspec
from PIL import Image, UnidentifiedImageError

from worldserve.config import ReasonerStageConfig, ServerConfig
from worldserve.engines.common import unsupported
from worldserve.engines.reasoner import admission
from worldserve.errors import InternalError, InvalidRequest, NotFound
from worldserve.ipc.capabilities import ReasonerCapabilities
from worldserve.ipc.messages import (
    ChatCompletion,
    ChatDelta,
    ChatResult,
    CloseSession,
    CreateSession,
    FrameResult,
    Message,
    ReasonerRetention,
    ReasonerSampling,
    Request,
    SessionClosed,
    SessionCreated,
    SessionFrame,
)
from worldserve.runtime.engine import EngineState, ReplyFn

FAKE_MAX_MODEL_LEN = 16384
FAKE_POSITIONS = 32768
FAKE_REASONING_WORDS = 6  # words of the fake reasoning block (enable_thinking)
FAKE_TOKENS_PER_FRAME = 64
IDLE_SLEEP_S = 0.005
WORDS = ("a", "person", "walks", "through", "the", "doorway", "car", "moves", "left", "right",
         "scene", "is", "quiet", "robot", "arm", "picks", "up", "box", "light", "changes",
         "nothing", "new", "door", "opens", "camera", "pans", "slowly", "hazard", "clear", "red")


@dataclass
class FakeSession:
    session_id: str
    retention: ReasonerRetention
    sampling: ReasonerSampling
    num_frames: int = 0


def check_grammar(sampling: ReasonerSampling) -> None:
    """What the hf backend compiles: a JSON schema object and a regular expression."""
    if sampling.guided_json is not None:
        try:
            schema = json.loads(sampling.guided_json)
        except ValueError as exc:
            raise InvalidRequest(f"guided_json is not valid JSON: {exc}") from None
        if not isinstance(schema, dict):
            raise InvalidRequest("guided_json must be a JSON Schema object")
    if sampling.guided_regex is not None:
        try:
            re.compile(sampling.guided_regex)
        except re.error as exc:
            raise InvalidRequest(f"guided_regex does not compile: {exc}") from None


def schema_instance(schema: dict[str, Any]) -> Any:
    """A small value that satisfies simple JSON schemas (enums, objects of scalars)."""
    if "enum" in schema and schema["enum"]:
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties") or {}
        return {k: schema_instance(v) for k, v in props.items() if isinstance(v, dict)}
    defaults = {"string": "fake", "integer": int(schema.get("minimum", 0)),
                "number": float(schema.get("minimum", 0)), "boolean": True, "array": [],
                "null": None}
    return defaults.get(kind, {})


def _digest(*parts: bytes) -> bytes:
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
    return h.digest()


def fake_words(digest: bytes) -> list[str]:
    count = 3 + digest[0] % 8
    return [WORDS[digest[1 + i] % len(WORDS)] for i in range(count)]


def compose_reply(digest: bytes, sampling: ReasonerSampling) -> tuple[str, str, int]:
    """(text, finish_reason, token_count) for a reply seeded by `digest`; one word = one token."""
    if sampling.guided_choice:
        words = [sampling.guided_choice[digest[0] % len(sampling.guided_choice)]]
    elif sampling.guided_json is not None:
        words = [json.dumps(schema_instance(json.loads(sampling.guided_json)))]
    else:
        words = fake_words(digest)
        # below min_tokens (with ignore_eos: until max_tokens) the reply goes on past its end
        length = sampling.max_tokens if sampling.ignore_eos else sampling.min_tokens
        words = [words[i % len(words)] for i in range(max(length, len(words)))]
    if len(words) >= sampling.max_tokens:  # no room left for the end-of-turn token
        return " ".join(words[: sampling.max_tokens]), "length", sampling.max_tokens
    text = " ".join(words)
    for stop in sampling.stop or ():
        if stop and stop in text:
            return text[: text.index(stop)].strip(), "stop", len(words)
    return text, "stop", len(words) + 1  # + the end-of-turn token


def decode_frame(image: bytes) -> tuple[int, int]:
    """Decode to RGB like the real engine does; a corrupt or truncated image is a 400."""
    try:
        with Image.open(io.BytesIO(image)) as img:
            rgb = img.convert("RGB")
            return rgb.size
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise InvalidRequest(f"invalid image: {exc}") from None


class FakeReasonerEngine:
    """Deterministic stand-in for the hf reasoner engine (same messages, admission, shape)."""

    def __init__(self, stage_config: ReasonerStageConfig, server_config: ServerConfig) -> None:
        time.sleep(stage_config.fake_load_delay_s)  # a slow model load, for start-up tests
        self.config = stage_config
        self.streaming = stage_config.streaming
        self.model_name = stage_config.served_model_name or "fake-reasoner"
        self.model_path = str(stage_config.model_path or "fake")
        self.num_params = 0
        self.model_limits = admission.ModelLimits(
            stage_config.max_model_len or FAKE_MAX_MODEL_LEN, FAKE_POSITIONS)
        self.limits = admission.streaming_limits(self.streaming)
        self.sessions: dict[str, FakeSession] = {}
        # (due monotonic time, reply function, message); hung frames wait for cancel/close.
        self._pending: list[tuple[float, ReplyFn, Message]] = []
        self._hung: dict[str, str] = {}  # request_id -> session_id

    # ------------------------------------------------------------------ facts

    def capabilities(self) -> ReasonerCapabilities:
        """The fields of the hf engine's capabilities that the api reads."""
        return ReasonerCapabilities(
            backend="fake", dtype=_fake_dtype(self.config.dtype),
            streaming=self.config.fake_streaming, chat=True,
            max_model_len=self.model_limits.max_model_len,
            max_position_embeddings=self.model_limits.max_position_embeddings,
            retention=admission.server_retention(self.model_limits, self.streaming),
            library_retention=admission.library_retention(self.model_limits),
            sampling=ReasonerSampling(),
            max_sessions=self.limits.max_sessions,
            image_budget=self.limits.image_budget,
            encoder_capacity=self.limits.encoder_capacity,
        )

    def state(self) -> EngineState:
        return "ready"

    def stats(self) -> dict[str, Any]:
        return {"queue_depth": len(self._pending), "running": len(self._hung),
                "sessions": len(self.sessions)}

    # ------------------------------------------------------------------ requests

    def submit(self, request: Request, reply: ReplyFn) -> None:
        if isinstance(request, CreateSession):
            self._later(reply, self._create(request))
        elif isinstance(request, SessionFrame):
            self._frame(request, reply)
        elif isinstance(request, CloseSession):
            reply(self._close(request))
        elif isinstance(request, ChatCompletion):
            for message in self._chat(request):
                self._later(reply, message)
        else:
            raise unsupported(request, "reasoner")

    def _create(self, req: CreateSession) -> SessionCreated:
        admission.check_retention(req.retention, req.sampling, self.model_limits, self.limits)
        check_grammar(req.sampling)
        admission.check_capacity([s.retention.max_video_segments for s in self.sessions.values()],
                                 req.retention.max_video_segments, self.limits)
        self.sessions[req.session_id] = FakeSession(req.session_id, req.retention, req.sampling)
        return SessionCreated(request_id=req.request_id, session_id=req.session_id,
                              retention=req.retention, sampling=req.sampling)

    def _frame(self, req: SessionFrame, reply: ReplyFn) -> None:
        session = self.sessions.get(req.session_id)
        if session is None:
            raise NotFound(f"session '{req.session_id}' not found")
        index = session.num_frames
        if index == self.config.fake_fail_on_frame:
            raise InternalError(f"fake engine failure on frame {index}")
        started = time.perf_counter()
        decode_frame(req.image)
        decode_ms = (time.perf_counter() - started) * 1000
        if index == self.config.fake_hang_on_frame:
            self._hung[req.request_id] = req.session_id
            return
        session.num_frames += 1
        digest = _digest(req.image, index.to_bytes(8, "little"))
        text, finish, count = compose_reply(digest, session.sampling)
        window = min(index + 1, session.retention.max_video_segments)
        latency = time.time() - req.received_at + self.config.fake_delay_ms / 1000
        result = FrameResult(
            request_id=req.request_id, frame_index=index, text=text, finish_reason=finish,
            token_count=count, ttft_s=round(latency / 2, 6), latency_s=round(latency, 6),
            decode_ms=round(decode_ms, 3), build_ms=0.0, engine_ms=self.config.fake_delay_ms,
            inqueue_ms=0.0,
            evicted_segments=int(index >= session.retention.max_video_segments),
            reprefill_ms=None, session_tokens=FAKE_TOKENS_PER_FRAME * (window + 1))
        self._later(reply, result)

    def _close(self, req: CloseSession) -> SessionClosed:
        session = self.sessions.pop(req.session_id, None)
        for request_id, session_id in list(self._hung.items()):
            if session_id == req.session_id:
                del self._hung[request_id]
        return SessionClosed(request_id=req.request_id, session_id=req.session_id,
                             frames=session.num_frames if session else 0)

    def _chat(self, req: ChatCompletion) -> list[Message]:
        check_grammar(req.sampling)
        parts = [msgspec.msgpack.encode(m) for m in req.messages]
        prompt_tokens = sum(len((p.text or "").split()) + (FAKE_TOKENS_PER_FRAME if p.image else 0)
                            + FAKE_TOKENS_PER_FRAME * len(p.frames)
                            for m in req.messages for p in m.parts)
        req = admission.fit_max_tokens(req, prompt_tokens, self.model_limits.max_model_len)
        text, finish, count = compose_reply(_digest(*parts), req.sampling)
        reasoning = _fake_reasoning(req)
        out: list[Message] = []
        if req.stream:
            out = [ChatDelta(request_id=req.request_id, text="", reasoning=w)
                   for w in _word_deltas(reasoning or "")]
            out += [ChatDelta(request_id=req.request_id, text=w) for w in _word_deltas(text)]
        thought = len((reasoning or "").split())
        out.append(ChatResult(request_id=req.request_id, text=text, reasoning=reasoning,
                              finish_reason=finish, prompt_tokens=prompt_tokens,
                              completion_tokens=count + thought, reasoning_tokens=thought))
        return out

    # ------------------------------------------------------------------ loop

    def _later(self, reply: ReplyFn, message: Message) -> None:
        if self.config.fake_delay_ms <= 0:
            reply(message)
            return
        due = time.monotonic() + self.config.fake_delay_ms / 1000
        self._pending.append((due, reply, message))

    def cancel(self, request_id: str) -> None:
        self._hung.pop(request_id, None)
        self._pending = [p for p in self._pending if p[2].request_id != request_id]

    def has_work(self) -> bool:
        return bool(self._pending)

    def step(self) -> None:
        """Send the replies that are due; otherwise sleep briefly (bounded) instead of spinning."""
        now = time.monotonic()
        due = [p for p in self._pending if p[0] <= now]
        if not due:
            next_due = min(p[0] for p in self._pending)
            time.sleep(min(IDLE_SLEEP_S, max(0.0, next_due - now)))
            return
        self._pending = [p for p in self._pending if p[0] > now]
        for _, reply, message in due:
            reply(message)

    def shutdown(self) -> None:
        self._pending.clear()
        self._hung.clear()


def _fake_reasoning(req: ChatCompletion) -> str | None:
    """With `enable_thinking`: a reasoning block of at most `thinking_token_budget` words."""
    if not req.template_kwargs.get("enable_thinking"):
        return None
    budget = req.thinking_token_budget or FAKE_REASONING_WORDS
    return " ".join(["considering"] * min(budget, FAKE_REASONING_WORDS))


def _word_deltas(text: str) -> list[str]:
    """`text` as streamed deltas, one word each (the joined deltas equal `text`)."""
    words = text.split(" ")
    return [w if i == 0 else " " + w for i, w in enumerate(words) if w]


def _fake_dtype(dtype: str) -> str:
    """The fake engine holds no tensors and plans on the CPU: `auto` is float32 there."""
    return "float32" if dtype == "auto" else dtype
