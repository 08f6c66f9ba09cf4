"""Units of engine work: a session frame and a one-shot chat completion.

Each job's `step()` does one bounded unit (one prefill group or one decode step) so the
engine can round-robin between jobs. Jobs reply through the stage's reply function.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from worldserve.engines.reasoner.contract import ReasonerRunner, SequenceKV
from worldserve.engines.reasoner.decoding import (
    Proposer,
    ReplyDecoder,
    decode_step,
    propose,
    verify,
)
from worldserve.engines.reasoner.guided import GrammarFactory
from worldserve.engines.reasoner.prompt import ChatPrompt, FrameChunk
from worldserve.engines.reasoner.scheduler import JobPhase
from worldserve.engines.reasoner.session import KVSession
from worldserve.errors import InvalidRequest, WorldserveError
from worldserve.ipc.messages import (
    ChatCompletion,
    ChatDelta,
    ChatResult,
    ErrorReply,
    FrameResult,
    SessionFrame,
)
from worldserve.runtime.engine import ReplyFn


@dataclass
class EngineContext:
    """What every job needs from the engine (one per engine)."""

    runner: ReasonerRunner
    tokenizer: Any
    stop_ids: set[int]
    grammars: GrammarFactory
    proposer: Proposer | None
    max_model_len: int
    max_position_embeddings: int
    max_prefill_tokens: int
    banned_ids: tuple[int, ...] = ()


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
        self._fed: list[int] = []
        self._group: list[Any] = []  # the segments of a batched prefill group

    def step(self) -> None:
        t0 = time.perf_counter()
        try:
            if self.phase is JobPhase.QUEUED:
                self._start()
            if self.phase is JobPhase.PREFILL:
                self._prefill()
            elif self.phase is JobPhase.DECODE:
                assert self.decoder is not None and self.session.kv is not None
                self.pending = decode_step(self.ctx.runner, self.session.kv, self.decoder,
                                           self.pending, self.ctx.proposer)
                self._after_token()
        finally:
            self.engine_s += time.perf_counter() - t0

    def batch_input(self) -> tuple[SequenceKV, list[int]]:
        """(cache, tokens to feed) for a batched decode step (phase DECODE only)."""
        assert self.session.kv is not None and self.decoder is not None
        self._fed = propose(self.session.kv, self.decoder, self.pending, self.ctx.proposer)
        return self.session.kv, self._fed

    def apply_logits(self, logits: torch.Tensor, engine_s: float, first: int) -> None:
        """Finish a batched decode step from this job's logits rows (one per fed token) and
        the token already sampled from the first row."""
        assert self.decoder is not None and self.session.kv is not None
        self.engine_s += engine_s
        self.pending = verify(self.session.kv, self.decoder, self._fed, logits,
                              self.ctx.proposer, first)
        self._after_token()

    def _start(self) -> None:
        self.started = time.time()
        session, r = self.session, self.session.retention
        try:
            self.evicted = session.add_chunk(self.chunk, session.sampling.max_tokens,
                                             self.ctx.max_model_len)
        except InvalidRequest:
            session.end_frame()  # the frame is discarded; the session stays usable
            raise
        if session.needs_reprefill(r.reprefill_threshold * self.ctx.max_position_embeddings):
            session.reset_cache()
            self.reprefill_s = 0.0
        self.phase = JobPhase.PREFILL

    @property
    def batchable_prefill(self) -> bool:
        """A new frame's prefill that may share a forward with others' (`prefill_input`);
        a re-prefill runs on its own (it reuses the retained frames' image encodings)."""
        return self.phase is JobPhase.QUEUED or (self.phase is JobPhase.PREFILL
                                                 and self.reprefill_s is None)

    def prefill_input(self) -> tuple[SequenceKV, list[int], list[Any]] | None:
        """(cache, ids, images) of this job's next prefill group for a batched prefill, or
        None when it must run alone (`step()`): a re-prefill. Starts the frame if queued."""
        t0 = time.perf_counter()
        try:
            if self.phase is JobPhase.QUEUED:
                self._start()
        finally:
            self.engine_s += time.perf_counter() - t0
        if not self.batchable_prefill:
            return None
        assert self.session.kv is not None
        self._group, ids, image_seg = self.session.next_group(self.ctx.max_prefill_tokens)
        return self.session.kv, ids, [image_seg.image] if image_seg is not None else []

    def apply_prefill(self, logits: torch.Tensor, engine_s: float) -> None:
        """Finish a batched prefill group from its last position's logits (V,)."""
        self.engine_s += engine_s
        self.session.mark_cached(self._group)
        self._after_prefill_group(logits)

    def _prefill(self) -> None:
        t0 = time.perf_counter()
        logits = self.session.prefill_next(self.ctx.runner, self.ctx.max_prefill_tokens)
        if self.reprefill_s is not None:
            self.reprefill_s += time.perf_counter() - t0
        self._after_prefill_group(logits)

    def _after_prefill_group(self, logits: torch.Tensor) -> None:
        """After a prefill group: once the frame is cached, sample the reply's first token."""
        session = self.session
        if session.has_uncached():
            return
        assert session.kv is not None
        session.begin_reply()
        guide = self.ctx.grammars.matcher(session.grammar) if session.grammar else None
        self.decoder = ReplyDecoder(session.sampling, session.kv.ids, self.ctx.stop_ids,
                                    self.ctx.tokenizer, self.ctx.runner.vocab_size,
                                    session.generator, guide, self.ctx.banned_ids)
        self.pending = self.decoder.sample(logits)
        self.decoder.accept(self.pending)
        self.phase = JobPhase.DECODE
        self._after_token()

    def _after_token(self) -> None:
        assert self.decoder is not None
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
                 reply: ReplyFn, ctx: EngineContext) -> None:
        self.request_id = request.request_id
        self.request = request
        self.prompt = prompt
        self.grammar = grammar
        self.reply = reply
        self.ctx = ctx
        self.phase = JobPhase.PREFILL
        self.kv = ctx.runner.new_kv()
        self.generator = torch.Generator()
        if request.sampling.seed is not None:
            self.generator.manual_seed(request.sampling.seed)
        else:
            self.generator.seed()
        self.decoder: ReplyDecoder | None = None
        self.pending = 0
        self._fed: list[int] = []
        self.sent_chars = 0

    def step(self) -> None:
        ctx = self.ctx
        if self.phase is JobPhase.PREFILL:
            logits = ctx.runner.forward(self.kv, self.prompt.input_ids, self.prompt.images)[-1]
            guide = ctx.grammars.matcher(self.grammar) if self.grammar else None
            self.decoder = ReplyDecoder(self.request.sampling, self.prompt.input_ids, ctx.stop_ids,
                                        ctx.tokenizer, ctx.runner.vocab_size, self.generator, guide,
                                        ctx.banned_ids)
            self.pending = self.decoder.sample(logits)
            self.decoder.accept(self.pending)
            self.phase = JobPhase.DECODE
        else:
            assert self.decoder is not None
            self.pending = decode_step(ctx.runner, self.kv, self.decoder, self.pending,
                                       ctx.proposer)
        self._emit()

    def batch_input(self) -> tuple[SequenceKV, list[int]]:
        assert self.decoder is not None
        self._fed = propose(self.kv, self.decoder, self.pending, self.ctx.proposer)
        return self.kv, self._fed

    def apply_logits(self, logits: torch.Tensor, engine_s: float, first: int) -> None:
        assert self.decoder is not None
        self.pending = verify(self.kv, self.decoder, self._fed, logits, self.ctx.proposer,
                              first)
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
