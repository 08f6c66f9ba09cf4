"""Reasoner stage engine (`hf` backend): Qwen-VL family models through transformers.

Live sessions keep a per-session KV cache (spec streaming-reasoning.md sections 10-13); chat
completions run on a fresh cache. `step()` runs one unit of one job, round-robin over jobs,
so a long prefill of one session delays another by at most one unit.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Any

import torch

from worldserve.config import ReasonerStageConfig, ServerConfig
from worldserve.engines.common import ModelLoadError, model_dir, served_model_name, unsupported
from worldserve.engines.reasoner import admission, dflash
from worldserve.engines.reasoner.contract import ReasonerRunner
from worldserve.engines.reasoner.decoding import NgramProposer, Proposer, sample_rows
from worldserve.engines.reasoner.guided import GrammarFactory
from worldserve.engines.reasoner.jobs import ChatJob, EngineContext, FrameJob
from worldserve.engines.reasoner.prompt import PromptBuilder
from worldserve.engines.reasoner.scheduler import JobPhase, ReasonerBatch, ReasonerScheduler
from worldserve.engines.reasoner.session import KVSession, KVSessionState
from worldserve.errors import Conflict, InvalidRequest, NotFound, NotSupported
from worldserve.ipc.capabilities import ReasonerCapabilities
from worldserve.ipc.messages import (
    ChatCompletion,
    ChatMessage,
    ChatPart,
    CloseSession,
    CreateSession,
    ReasonerSampling,
    Request,
    SessionClosed,
    SessionCreated,
    SessionFrame,
)
from worldserve.models import registry
from worldserve.runtime.engine import EngineState, ReplyFn

log = logging.getLogger("worldserve.reasoner")
MAX_TOMBSTONES = 1024


class ReasonerEngine:
    def __init__(self, stage_config: ReasonerStageConfig, server_config: ServerConfig) -> None:
        path = model_dir(stage_config)
        runner: ReasonerRunner = registry.load_runner(
            "reasoner", path, dtype=stage_config.dtype, device=stage_config.device)
        proposer: Proposer | None = None
        if stage_config.streaming.spec_method == "dflash":
            runner, proposer = dflash.attach(runner, stage_config)
        elif stage_config.streaming.spec_method == "ngram":
            proposer = NgramProposer(stage_config.streaming.spec_num_tokens)
        self.config = stage_config
        self.runner = runner
        self.model = runner.model
        self.model_name = served_model_name(stage_config, path)
        self.model_path = str(path)
        self.num_params = runner.num_params
        self.prompts = PromptBuilder(runner.tokenizer, runner.image_processor,
                                     runner.chat_template)
        p = self.runner.max_position_embeddings
        m = stage_config.max_model_len or p or 4096
        self.model_limits = admission.ModelLimits(m, p or m)
        self.limits = admission.streaming_limits(stage_config.streaming)
        self.default_sampling = ReasonerSampling()
        self.default_retention = admission.server_retention(self.model_limits,
                                                            stage_config.streaming)
        try:
            admission.check_retention(self.default_retention, self.default_sampling,
                                      self.model_limits, self.limits)
        except InvalidRequest as exc:
            raise ModelLoadError(
                f"stages.reasoner.streaming: the server retention policy can never be admitted "
                f"for this model: {exc.message}") from None
        self.ctx = EngineContext(
            runner=self.runner, tokenizer=runner.tokenizer, stop_ids=self._stop_ids(runner),
            grammars=GrammarFactory(runner.tokenizer, self.runner.vocab_size), proposer=proposer,
            max_model_len=m, max_position_embeddings=p or m,
            max_prefill_tokens=stage_config.max_prefill_tokens,
            banned_ids=self.prompts.placeholder_ids,
        )
        self.sessions: dict[str, KVSession] = {}
        # Dead sessions moved out of capacity accounting: id -> frames, until CloseSession.
        self._tombstones: OrderedDict[str, int] = OrderedDict()
        self.scheduler = ReasonerScheduler(stage_config.batch_decode)
        if stage_config.warmup_mode == "server":
            self._warmup()

    def _warmup(self) -> None:
        """One image chat through every code path (vision, prefill, decode) before `ready`."""
        import io

        from PIL import Image

        buf = io.BytesIO()
        Image.new("RGB", (224, 224), (128, 128, 128)).save(buf, format="PNG")
        request = ChatCompletion(request_id="warmup", sampling=ReasonerSampling(max_tokens=2),
                                 messages=[ChatMessage(role="user", parts=[
                                     ChatPart(type="image", image=buf.getvalue()),
                                     ChatPart(type="text", text="warmup")])])
        self._chat(request, lambda _: None)
        while self.has_work():
            self.step()

    def _stop_ids(self, loaded: ReasonerRunner) -> set[int]:
        ids = set()
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if loaded.tokenizer.eos_token_id is not None:
            ids.add(loaded.tokenizer.eos_token_id)
        first = self.prompts.end_of_turn_ids[0]
        if first in set(loaded.tokenizer.all_special_ids):  # e.g. <|im_end|> of ChatML
            ids.add(first)
        return ids

    # ------------------------------------------------------------------ facts

    def capabilities(self) -> ReasonerCapabilities:
        s = self.config.streaming
        return ReasonerCapabilities(
            backend="hf", streaming=s.enabled, chat=True,
            retention=self.default_retention,
            library_retention=admission.library_retention(self.model_limits),
            sampling=self.default_sampling,
            max_sessions=self.limits.max_sessions,
            image_budget=self.limits.image_budget,
            encoder_capacity=self.limits.encoder_capacity,
            architecture=type(self.model).__name__,
            dtype=self.config.dtype,
            max_model_len=self.model_limits.max_model_len,
            max_position_embeddings=self.model_limits.max_position_embeddings,
            spec_method=s.spec_method, spec_num_tokens=s.spec_num_tokens,
            guided_decoding_backend="llguidance",
        )

    def state(self) -> EngineState:
        return "ready"

    def stats(self) -> dict[str, Any]:
        running = self.scheduler.num_started()
        live = sum(1 for s in self.sessions.values() if s.state is not KVSessionState.DEAD)
        extra: dict[str, Any] = {"forwards": self.runner.num_forwards,
                                 "kv_tokens": sum(len(s.kv) for s in self.sessions.values()
                                                  if s.kv is not None)}
        if self.ctx.proposer is not None:
            extra["spec_drafted"] = self.ctx.proposer.num_drafted
            extra["spec_accepted"] = self.ctx.proposer.num_accepted
            extra["spec_steps"] = self.ctx.proposer.num_steps
        return {"queue_depth": len(self.scheduler) - running, "running": running, "sessions": live,
                "extra": extra}

    # ------------------------------------------------------------------ requests

    def submit(self, request: Request, reply: ReplyFn) -> None:
        if isinstance(request, SessionFrame):
            self._frame(request, reply)
        elif isinstance(request, CreateSession):
            reply(self._create(request))
        elif isinstance(request, CloseSession):
            reply(self._close(request))
        elif isinstance(request, ChatCompletion):
            self._chat(request, reply)
        else:
            raise unsupported(request, "reasoner")

    def _create(self, req: CreateSession) -> SessionCreated:
        if not self.config.streaming.enabled:
            raise NotSupported("streaming sessions are disabled on this server")
        if req.session_id in self.sessions:
            raise Conflict(f"session {req.session_id!r} already exists")
        admission.check_retention(req.retention, req.sampling, self.model_limits, self.limits)
        grammar = self.ctx.grammars.compile(req.sampling)
        self._reap_dead()
        live = [s.retention.max_video_segments for s in self.sessions.values()]
        admission.check_capacity(live, req.retention.max_video_segments, self.limits)
        self.sessions[req.session_id] = KVSession(
            req.session_id, req.system_prompt, req.question, req.retention, req.sampling, grammar,
            self.runner.new_kv())
        return SessionCreated(request_id=req.request_id, session_id=req.session_id,
                              retention=req.retention, sampling=req.sampling)

    def _reap_dead(self) -> None:
        """Dead sessions hold no cache; they only wait for CloseSession to report `frames`.
        Keep them out of capacity by moving them to tombstones."""
        for sid in [sid for sid, s in self.sessions.items() if s.state is KVSessionState.DEAD]:
            self._tombstones[sid] = self.sessions.pop(sid).frames
        while len(self._tombstones) > MAX_TOMBSTONES:
            self._tombstones.popitem(last=False)

    def _session(self, session_id: str) -> KVSession:
        session = self.sessions.get(session_id)
        if session is None:
            if session_id in self._tombstones:
                raise Conflict("session is no longer usable; create a new session")
            raise NotFound(f"session {session_id!r} not found")
        return session

    def _frame(self, req: SessionFrame, reply: ReplyFn) -> None:
        session = self._session(req.session_id)
        if session.state is KVSessionState.DEAD:
            raise Conflict("session is no longer usable; create a new session")
        if session.state is KVSessionState.BUSY:
            raise Conflict("session busy: a frame is already being processed")
        first = session.is_first_frame
        chunk = self.prompts.frame_chunk(
            req.image, session.system_prompt if first else None, session.question,
            session.pending_token, self.ctx.stop_ids)
        session.begin_frame()
        self.scheduler.add(FrameJob(req, session, chunk, reply, self.ctx))

    def _close(self, req: CloseSession) -> SessionClosed:
        session = self.sessions.pop(req.session_id, None)
        if session is None:
            if req.session_id in self._tombstones:
                frames = self._tombstones.pop(req.session_id)
                return SessionClosed(request_id=req.request_id, session_id=req.session_id,
                                     frames=frames)
            raise NotFound(f"session {req.session_id!r} not found")
        for job in self.scheduler.remove_where(
                lambda j: isinstance(j, FrameJob) and j.session is session):
            job.abort(closed=True)
        session.kill()
        return SessionClosed(request_id=req.request_id, session_id=req.session_id,
                             frames=session.frames)

    def _chat(self, req: ChatCompletion, reply: ReplyFn) -> None:
        grammar = self.ctx.grammars.compile(req.sampling)
        messages, images = [], []
        for message in req.messages:
            content: list[dict] = []
            for part in message.parts:
                if part.type == "image" and part.image is not None:
                    content.append({"type": "image"})
                    images.append(part.image)
                elif part.type == "text":
                    content.append({"type": "text", "text": part.text or ""})
            messages.append({"role": message.role, "content": content})
        prompt = self.prompts.chat_prompt(messages, images)
        if len(prompt.input_ids) + req.sampling.max_tokens > self.model_limits.max_model_len:
            raise InvalidRequest(
                f"prompt ({len(prompt.input_ids)} tokens) + max_tokens ({req.sampling.max_tokens})"
                f" exceeds the model context length ({self.model_limits.max_model_len})")
        self.scheduler.add(ChatJob(req, prompt, grammar, reply, self.ctx))

    def cancel(self, request_id: str) -> None:
        for job in self.scheduler.remove_where(lambda j: j.request_id == request_id):
            job.abort()

    # ------------------------------------------------------------------ the loop

    def has_work(self) -> bool:
        return len(self.scheduler) > 0

    def step(self) -> None:
        """schedule -> execute -> update: one unit of the head job (or one batched decode step
        of several decoding jobs); unfinished jobs go back to the end of the queue."""
        batch = self.scheduler.schedule()
        if batch is None:
            return
        try:
            self._execute(batch)
        except Exception as exc:  # a failing request must not take the stage down
            self._failed(batch, exc)
        self.scheduler.update(batch)

    def _execute(self, batch: ReasonerBatch) -> None:
        if batch.batched_decode:
            self._decode_batch(batch.jobs)
        elif batch.batched_prefill:
            self._prefill_batch(batch.jobs)
        else:
            batch.jobs[0].step()

    def _failed(self, batch: ReasonerBatch, exc: Exception) -> None:
        if not isinstance(exc, (Conflict, NotFound, InvalidRequest)):
            log.exception("request(s) %s failed", [j.request_id for j in batch.jobs])
        for job in batch.jobs:
            if job.phase is not JobPhase.DONE:
                job.fail(exc)

    def _prefill_batch(self, jobs: list[Any]) -> None:
        """The next prefill group of several new frames in one forward (one vision-tower call
        for their images). A frame that cannot start fails alone; a re-prefill runs alone."""
        inputs = []
        for job in jobs:
            try:
                got = job.prefill_input()
                if got is None:
                    job.step()
            except Exception as exc:
                self._failed(ReasonerBatch([job]), exc)
                continue
            if got is not None:
                inputs.append((job, got))
        if not inputs:
            return
        start = time.perf_counter()
        kvs, ids, images = zip(*(got for _, got in inputs))
        logits = self.runner.forward_prefill_batch(list(kvs), list(ids), list(images))
        share = (time.perf_counter() - start) / len(inputs)
        for (job, _), row in zip(inputs, logits):
            job.apply_prefill(row, share)

    def _decode_batch(self, jobs: list[Any]) -> None:
        """One decode step (with its drafts, if speculating) of every job, in one forward;
        every job's first position is sampled in one batched call."""
        start = time.perf_counter()
        kvs, fed = zip(*(j.batch_input() for j in jobs))
        logits = self.runner.forward_decode_batch(list(kvs), list(fed))
        firsts = sample_rows([j.decoder for j in jobs], torch.stack([row[0] for row in logits]))
        share = (time.perf_counter() - start) / len(jobs)
        for row, first, j in zip(logits, firsts, jobs):
            j.apply_logits(row, share, first)

    def shutdown(self) -> None:
        self.scheduler.clear()
        for session in self.sessions.values():
            session.kill()
        self.sessions.clear()

