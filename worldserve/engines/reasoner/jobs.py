"""Units of engine work: a session frame and a one-shot chat completion, as state and
transitions.

A job says what its next step needs (`prefill_row()` / `decode_row()`, typed rows of
`execute.py`) and takes what the step produced (`prefilled`, `accepted`); it never calls the
runner. Each engine step runs one bounded unit of a job (one prefill group or one decode step),
so the engine can round-robin between jobs. Jobs reply through the stage's reply function.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from worldserve.engines.reasoner.decoding import ReplyDecoder
from worldserve.engines.reasoner.execute import DecodeRow, PrefillRow
from worldserve.engines.reasoner.guided import GrammarFactory
from worldserve.engines.reasoner.prompt import ChatPrompt, FrameChunk
from worldserve.engines.reasoner.scheduler import JobPhase
from worldserve.engines.reasoner.session import CacheOps, KVSession, PrefillGroup
from worldserve.errors import InvalidRequest, WorldserveError
from worldserve.ipc.messages import (
    ChatCompletion,
    ChatDelta,
    ChatResult,
    ErrorReply,
    FrameResult,
    ReasonerSampling,
    SessionFrame,
)
from worldserve.runtime.engine import ReplyFn


@dataclass
class EngineContext:
    """What every job needs from the engine (one per engine)."""

    tokenizer: Any
    stop_ids: set[int]
    grammars: GrammarFactory
    vocab_size: int
    device: Any  # where the runner leaves logits: decoders keep their state there
    max_model_len: int
    max_position_embeddings: int
    max_prefill_tokens: int
    banned_ids: tuple[int, ...] = ()

    def decoder(self, sampling: ReasonerSampling, context_ids: list[int],
                generator: torch.Generator, grammar: str | None) -> ReplyDecoder:
        guide = self.grammars.matcher(grammar) if grammar else None
        return ReplyDecoder(sampling, context_ids, self.stop_ids, self.tokenizer, self.vocab_size,
                            generator, guide, self.banned_ids, self.device)


class FrameJob:
    """One frame of a session: eviction (+ re-prefill), prefill of the new chunk, the reply."""

    def __init__(self, request: SessionFrame, session: KVSession, chunk: FrameChunk,
                 reply: ReplyFn, ctx: EngineContext) -> None:
        self.request_id = request.request_id
        self.request = request
        self.session = session
        self.chunk = chunk
        self.reply = reply
        self.ctx = ctx
        self.phase = JobPhase.QUEUED
        self.submitted = time.time()
        self.engine_s = 0.0
        self.reprefill_s: float | None = None
        self.evicted = 0
        self.started = 0.0
        self.first_text_at: float | None = None
        self.decoder: ReplyDecoder | None = None
        self.pending = 0
        self._group: PrefillGroup | None = None

    @property
    def kv(self) -> Any:
        return self.session.kv

    @property
    def batchable_prefill(self) -> bool:
        """A new frame's prefill that may share a forward with others'; a re-prefill runs on
        its own (it reuses the retained frames' image encodings)."""
        return self.phase is JobPhase.QUEUED or (self.phase is JobPhase.PREFILL
                                                 and self.reprefill_s is None)

    def start(self) -> CacheOps:
        """QUEUED -> PREFILL: the frame's segments join the session; returns what the cache
        must undergo first (evictions, a reset for re-prefill)."""
        self.started = time.time()
        session, r = self.session, self.session.retention
        try:
            ops, self.evicted = session.add_chunk(
                self.chunk, session.sampling.max_tokens, self.ctx.max_model_len,
                r.reprefill_threshold * self.ctx.max_position_embeddings)
        except InvalidRequest:
            session.end_frame()  # the frame is discarded; the session stays usable
            raise
        if ops.reset:
            self.reprefill_s = 0.0
        self.phase = JobPhase.PREFILL
        return ops

    def prefill_row(self) -> PrefillRow:
        """The next prefill group; a group with a new image keeps its encoding (re-prefill)."""
        self._group = group = self.session.next_group(self.ctx.max_prefill_tokens)
        seg = group.image_segment
        if seg is None:
            return PrefillRow(self.session.kv, group.ids, [])
        return PrefillRow(self.session.kv, group.ids, [seg.image], seg.encoded, keep_encoded=True)

    def prefilled(self, row: PrefillRow) -> bool:
        """The group is cached. True when the whole frame is: the reply starts."""
        assert self._group is not None
        if row.keep_encoded and self._group.image_segment is not None:
            self._group.image_segment.encoded = row.encoded
        self.session.mark_cached(self._group)
        if self.session.has_uncached():
            return False
        session = self.session
        session.begin_reply()
        self.decoder = self.ctx.decoder(session.sampling, session.kv.ids, session.generator,
                                        session.grammar)
        return True

    def decode_row(self) -> DecodeRow:
        assert self.decoder is not None
        return DecodeRow(self.session.kv, self.pending, self.decoder)

    def add_time(self, engine_s: float) -> None:
        self.engine_s += engine_s
        if self.reprefill_s is not None and self.phase is JobPhase.PREFILL:
            self.reprefill_s += engine_s

    def accepted(self, token: int) -> None:
        """The step sampled (and the decoder accepted) `token`: it is pending, not fed."""
        assert self.decoder is not None
        self.pending = token
        self.phase = JobPhase.DECODE
        if self.first_text_at is None and self.decoder.text.strip():
            self.first_text_at = time.time()
        if self.decoder.finish_reason is None:
            return
        self.phase = JobPhase.DONE
        self.session.end_reply(self.pending)
        self.session.end_frame()
        self.reply(self._result())

    def _result(self) -> FrameResult:
        decoder, chunk, received = self.decoder, self.chunk, self.request.received_at
        assert decoder is not None and decoder.finish_reason is not None
        now = time.time()
        inqueue_ms = max(0.0, (self.started - received) * 1000 - chunk.decode_ms - chunk.build_ms)
        return FrameResult(
            request_id=self.request_id, frame_index=self.session.frames - 1,
            text=decoder.text.strip(), finish_reason=decoder.finish_reason,
            token_count=len(decoder.tokens),
            ttft_s=(self.first_text_at - received) if self.first_text_at else None,
            latency_s=now - received, decode_ms=chunk.decode_ms, build_ms=chunk.build_ms,
            engine_ms=self.engine_s * 1000, inqueue_ms=inqueue_ms,
            evicted_segments=self.evicted,
            reprefill_ms=self.reprefill_s * 1000 if self.reprefill_s is not None else None,
            session_tokens=self.session.retained_tokens,
        )

    def fail(self, exc: BaseException) -> None:
        """A client error leaves the session as it was; anything else kills it (spec 6.2)."""
        self.phase = JobPhase.DONE
        if isinstance(exc, WorldserveError):
            code, message = exc.code, exc.message
        else:
            code, message = "internal_error", f"engine failure: {exc}"
        if not isinstance(exc, InvalidRequest):
            self.session.kill()
        self.reply(ErrorReply(request_id=self.request_id, code=code, message=message))

    def abort(self, closed: bool = False) -> None:
        """Cancelled (frame timeout: no reply, the api gave up) or closed under the frame (the
        frame's request gets 409 `session was closed`). Either way the session is dead."""
        self.phase = JobPhase.DONE
        self.session.kill()
        if closed:
            self.reply(ErrorReply(request_id=self.request_id, code="conflict",
                                  message="session was closed"))


class ChatJob:
    """One chat completion on a fresh cache; streams `ChatDelta`s when asked."""

    batchable_prefill = False

    def __init__(self, request: ChatCompletion, prompt: ChatPrompt, grammar: str | None,
                 reply: ReplyFn, ctx: EngineContext, kv: Any) -> None:
        self.request_id = request.request_id
        self.request = request
        self.prompt = prompt
        self.grammar = grammar
        self.reply = reply
        self.ctx = ctx
        self.phase = JobPhase.PREFILL
        self.kv = kv
        self.generator = torch.Generator(device=ctx.device)
        if request.sampling.seed is not None:
            self.generator.manual_seed(request.sampling.seed)
        else:
            self.generator.seed()
        self.decoder: ReplyDecoder | None = None
        self.pending = 0
        self.sent_chars = 0

    def prefill_row(self) -> PrefillRow:
        return PrefillRow(self.kv, self.prompt.input_ids, self.prompt.media)

    def prefilled(self, row: PrefillRow) -> bool:
        self.decoder = self.ctx.decoder(self.request.sampling, self.prompt.input_ids,
                                        self.generator, self.grammar)
        return True

    def decode_row(self) -> DecodeRow:
        assert self.decoder is not None
        return DecodeRow(self.kv, self.pending, self.decoder)

    def add_time(self, engine_s: float) -> None:
        """Chat replies report no engine time."""

    def accepted(self, token: int) -> None:
        self.pending = token
        self.phase = JobPhase.DECODE
        self._emit()

    def _emit(self) -> None:
        decoder = self.decoder
        assert decoder is not None
        done = decoder.finish_reason is not None
        if self.request.stream:
            stop = self.request.sampling.stop
            text = decoder.text if done else _stable_prefix(decoder.text, stop)
            if len(text) > self.sent_chars:
                self.reply(ChatDelta(request_id=self.request_id, text=text[self.sent_chars:]))
                self.sent_chars = len(text)
        if done:
            self.phase = JobPhase.DONE
            self.kv.reset()
            self.reply(ChatResult(request_id=self.request_id, text=decoder.text,
                                  finish_reason=decoder.finish_reason or "stop",
                                  prompt_tokens=len(self.prompt.input_ids),
                                  completion_tokens=len(decoder.tokens)))

    def fail(self, exc: BaseException) -> None:
        self.phase = JobPhase.DONE
        code = exc.code if isinstance(exc, WorldserveError) else "internal_error"
        message = exc.message if isinstance(exc, WorldserveError) else f"engine failure: {exc}"
        self.reply(ErrorReply(request_id=self.request_id, code=code, message=message))

    def abort(self) -> None:
        self.phase = JobPhase.DONE
        self.kv.reset()


def _stable_prefix(text: str, stops: list[str] | None) -> str:
    """Text that can be streamed now: no trailing partial UTF-8 character and no tail that
    could still become a stop string."""
    text = text.rstrip("\ufffd")
    for stop in stops or []:
        for k in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:k]):
                text = text[:-k]
                break
    return text
