"""Reasoner stage engine (`hf` backend): a vision-language model family through its runner.

Live sessions keep a per-session KV cache (spec streaming-reasoning.md sections 10-13); chat
completions run on a fresh cache. `step()` is schedule -> execute -> update: one unit of one job
(or one batched prefill or decode step of several), round-robin over jobs, so a long prefill of
one session delays another by at most one unit. `_execute` turns the scheduled jobs into typed
rows for the step runner (`execute.py`, the only caller of the runner) and hands each job what
its step produced.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Any

from worldserve.config import ReasonerStageConfig, ServerConfig
from worldserve.engines.common import (
    ModelLoadError,
    model_dir,
    model_profile,
    served_model_name,
    unsupported,
)
from worldserve.engines.reasoner import admission, dflash
from worldserve.engines.reasoner.contract import ReasonerRunner
from worldserve.engines.reasoner.decoding import NgramProposer, Proposer
from worldserve.engines.reasoner.execute import StepRunner
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
from worldserve.runtime.devices import resolve_in_process
from worldserve.runtime.engine import EngineState, ReplyFn

log = logging.getLogger("worldserve.reasoner")
MAX_TOMBSTONES = 1024


class ReasonerEngine:
    def __init__(self, stage_config: ReasonerStageConfig, server_config: ServerConfig) -> None:
        stage_config = resolve_in_process(stage_config)  # `auto` device/dtype, built by hand
        path = model_dir(stage_config)
        runner: ReasonerRunner = registry.load_runner(
            "reasoner", path, dtype=stage_config.dtype, device=stage_config.device,
            **stage_config.quant_options())
        proposer: Proposer | None = None
        if stage_config.streaming.spec_method == "dflash":
            runner, proposer = dflash.attach(runner, stage_config)
        elif stage_config.streaming.spec_method == "ngram":
            proposer = NgramProposer(stage_config.streaming.spec_num_tokens)
        self.config = stage_config
        self.runner = runner
        self.steps = StepRunner(runner, proposer)
        self.decode_path = self.steps.configure_decode(stage_config.static_decode,
                                                       stage_config.compile_decode,
                                                       stage_config.cuda_graphs)
        self.model = runner.model
        self.model_name = served_model_name(stage_config, path)
        self.model_path = str(path)
        self.profile = model_profile("reasoner", path, stage_config.dtype)
        self.num_params = runner.num_params
        self.prompts = PromptBuilder(runner.tokenizer, runner.chat_template, runner.prompting)
        p = runner.max_position_embeddings
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
            tokenizer=runner.tokenizer, stop_ids=self._stop_ids(runner),
            grammars=GrammarFactory(runner.tokenizer, runner.vocab_size),
            vocab_size=runner.vocab_size, device=runner.device, max_model_len=m,
            max_position_embeddings=p or m, max_prefill_tokens=stage_config.max_prefill_tokens,
            banned_ids=self.prompts.placeholder_ids,
        )
        self.sessions: dict[str, KVSession] = {}
        # Dead sessions moved out of capacity accounting: id -> frames, until CloseSession.
        self._tombstones: OrderedDict[str, int] = OrderedDict()
        self.scheduler = ReasonerScheduler(stage_config.batch_decode)
        log.info("reasoner decode path: %s", self.decode_path)
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
            variant=self.profile.variant, precision=self.profile.precision,
        )

    def state(self) -> EngineState:
        return "ready"

    def stats(self) -> dict[str, Any]:
        running = self.scheduler.num_started()
        live = sum(1 for s in self.sessions.values() if s.state is not KVSessionState.DEAD)
        extra: dict[str, Any] = {"forwards": self.runner.num_forwards,
                                 "decode_path": self.decode_path,
                                 "kv_tokens": sum(len(s.kv) for s in self.sessions.values()
                                                  if s.kv is not None)}
        proposer = self.steps.proposer
        if proposer is not None:
            extra["spec_drafted"] = proposer.num_drafted
            extra["spec_accepted"] = proposer.num_accepted
            extra["spec_steps"] = proposer.num_steps
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
            self.steps.new_kv(), self.ctx.device)
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
        messages, media = [], []
        for message in req.messages:
            content: list[dict] = []
            for part in message.parts:
                if part.type == "image" and part.image is not None:
                    content.append({"type": "image"})
                    media.append(self.prompts.prompting.read_image(part.image))
                elif part.type == "video" and part.frames:
                    content.append({"type": "video"})
                    media.append(self.prompts.prompting.read_video(part.frames, part.fps or 1.0))
                elif part.type == "text":
                    content.append({"type": "text", "text": part.text or ""})
            messages.append({"role": message.role, "content": content})
        prompt = self.prompts.chat_prompt(messages, media, req.template_kwargs)
        req = admission.fit_max_tokens(req, len(prompt.input_ids), self.model_limits.max_model_len)
        self.scheduler.add(ChatJob(req, prompt, grammar, reply, self.ctx, self.steps.new_kv()))

    def cancel(self, request_id: str) -> None:
        for job in self.scheduler.remove_where(lambda j: j.request_id == request_id):
            job.abort()

    # ------------------------------------------------------------------ the loop

    def has_work(self) -> bool:
        return len(self.scheduler) > 0

    def step(self) -> None:
        """schedule -> execute -> update: one unit of the head job (or one batched step of
        several jobs); unfinished jobs go back to the end of the queue."""
        batch = self.scheduler.schedule()
        if batch is None:
            return
        try:
            self._execute(batch)
        except Exception as exc:  # a failing request must not take the stage down
            self._failed(batch.jobs, exc)
        self.scheduler.update(batch)

    def _execute(self, batch: ReasonerBatch) -> None:
        """Rows in, tokens out: a decode step of decoding jobs, else a prefill step."""
        start = time.perf_counter()
        if batch.jobs[0].phase is JobPhase.DECODE:
            jobs: list[Any] = batch.jobs
            tokens = self.steps.decode([job.decode_row() for job in jobs])
            self._finish(jobs, [(job, token) for job, token in zip(jobs, tokens)], start)
        else:
            self._prefill(batch.jobs, start)

    def _prefill(self, jobs: list[Any], start: float) -> None:
        """The next prefill group of every job: new frames together in one forward, a
        re-prefill or a chat prompt alone. A frame that cannot start fails alone."""
        ready = []
        for job in jobs:
            try:
                if job.phase is JobPhase.QUEUED:
                    self.steps.apply(job.kv, job.start())
                ready.append(job)
            except Exception as exc:
                if len(jobs) == 1:
                    raise
                self._failed([job], exc)
        together = [job for job in ready if job.batchable_prefill]
        groups = [together] if together else []
        groups += [[job] for job in ready if not job.batchable_prefill]
        done = []
        for group in groups:
            rows = [job.prefill_row() for job in group]
            logits = self.steps.prefill(rows)
            done += [(job, row_logits) for job, row, row_logits in zip(group, rows, logits)
                     if job.prefilled(row)]
        tokens = self.steps.first_tokens([job.decoder for job, _ in done],
                                         [row_logits for _, row_logits in done]) if done else []
        self._finish(ready, [(job, token) for (job, _), token in zip(done, tokens)], start)

    @staticmethod
    def _finish(jobs: list[Any], sampled: list[tuple[Any, int]], start: float) -> None:
        """Each job's share of the step's time, then its sampled token."""
        share = (time.perf_counter() - start) / max(len(jobs), 1)
        for job in jobs:
            job.add_time(share)
        for job, token in sampled:
            job.accepted(token)

    def _failed(self, jobs: list[Any], exc: Exception) -> None:
        if not isinstance(exc, (Conflict, NotFound, InvalidRequest)):
            log.exception("request(s) %s failed", [j.request_id for j in jobs])
        for job in jobs:
            if job.phase is not JobPhase.DONE:
                job.fail(exc)

    def shutdown(self) -> None:
        self.scheduler.clear()
        for session in self.sessions.values():
            session.kill()
        self.sessions.clear()
