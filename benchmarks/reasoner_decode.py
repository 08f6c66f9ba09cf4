"""`benchmarks/reasoner.py --parts decode`: the reasoner's decode step, before and after it left
the host.

Model: the Cosmos3 Omni dev reasoner at Nano depth: 36 decoder layers and the 151,936-token
vocabulary of Cosmos3-Nano / Qwen3-VL, tiny width (hidden 32), so that per-step host work
(ops dispatched, Python) dominates the way it does for Nano on a GPU. Built once into the dev
cache (seeded, random weights, logits scaled: `LOGIT_SCALE`).

Arms, in one process, interleaved:
  before   transformers' forward (`static_decode: false`), logits copied to the host and the
           host sampler of before (its full-vocabulary sort under the default top_p), kept
           verbatim in this module;
  sampler  transformers' forward, the device-side sampler (`engines/reasoner/sampling.py`);
  after    the static decode step (`models/qwen_vl/decode.py`) and the device-side sampler;
  compiled (with --compile) the static step under torch.compile.
  graphs   (with --graphs) the static step captured as CUDA graphs and replayed
           (`cuda_graphs`; on the CPU a replay reruns the step: only the overhead shows).

Per arm and batch size (1 and 4 sessions decoding together, default sampling: temperature 0.3,
top_p 0.9, repetition penalty 1.1): aten ops dispatched per decode step (a TorchDispatchMode
around the engine's decode step: forward, sampling, verification), ms per decode step and per
token (wall clock of the decode steps only, medians over repeats). Ops are counted two ways:
dispatched under a TorchDispatchMode (the method of the 2,815 baseline; not for the compiled
arm, whose graphs do not run under a dispatch mode) and as the profiler's top-level aten ops
(every arm). Every arm's replies are asserted equal to the first arm's (same seeds:
token-identical).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

NANO_LAYERS = 36
NANO_VOCAB = 151_936
# The random model's logits have a standard deviation of about 0.1: at the default temperature
# (0.3) its top_p (0.9) nucleus would hold ~124,000 of the 151,936 tokens, which no trained
# model does. Its final norm is scaled so the logits spread like a trained model's (std ~3):
# the nucleus then holds a handful of tokens (6 at the first step).
LOGIT_SCALE = 30.0


def nano_model_path(root: Path) -> Path:
    """The Omni dev reasoner rebuilt at Nano depth and vocabulary (written on first use)."""
    from transformers import Cosmos3OmniConfig, Cosmos3OmniForConditionalGeneration

    from worldserve.models.cosmos3_reasoner.dev import write_reasoner_files
    from worldserve.models.dev.seeding import seeded

    target = root / "bench-nano-depth"
    if (target / "model.safetensors").is_file():
        return target
    target.mkdir(parents=True, exist_ok=True)
    write_reasoner_files(target, 0, "cosmos3_omni")
    config = json.loads((target / "config.json").read_text())
    config["text_config"].update(num_hidden_layers=NANO_LAYERS, vocab_size=NANO_VOCAB)
    kwargs = {k: v for k, v in config.items()
              if k not in ("architectures", "transformers_version", "model_type")}
    with seeded(0, "bench-nano-depth"):
        model = Cosmos3OmniForConditionalGeneration(Cosmos3OmniConfig(**kwargs)).eval()
    with torch.no_grad():  # logits spread like a trained model's (see LOGIT_SCALE)
        model.model.language_model.norm.weight.fill_(LOGIT_SCALE)
    generation = json.loads((target / "generation_config.json").read_text())
    model.generation_config.eos_token_id = generation.get("eos_token_id")
    model.save_pretrained(target)
    return target


# ---------------------------------------------------------------- the host sampler of before


def legacy_sample_rows(decoders: list[Any], logits: torch.Tensor) -> list[int]:
    """The sampler before this change (commit 3fcc292, `decoding.sample_rows`): logits copied
    to the host, penalties, softmax, a full-vocabulary sort per top_p row, per-row draws."""
    logits = logits.float().cpu()
    first = decoders[0]
    logits = logits[:, : first.seen.shape[0]].clone()
    logits[:, first.banned.cpu()] = float("-inf")
    samplings = [d.sampling for d in decoders]
    if any(s.repetition_penalty != 1.0 for s in samplings):
        penalty = _per_row([s.repetition_penalty for s in samplings])
        seen = torch.stack([d.seen.cpu() for d in decoders])
        penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
        logits = torch.where(seen, penalised, logits)
    if any(s.frequency_penalty or s.presence_penalty for s in samplings):
        counts = torch.stack([d.counts.cpu() for d in decoders])
        logits -= _per_row([s.frequency_penalty for s in samplings]) * counts
        logits -= _per_row([s.presence_penalty for s in samplings]) * (counts > 0).float()
    for b, d in enumerate(decoders):
        allowed = d.allowed()
        if allowed is not None:
            logits[b] = logits[b].masked_fill(~allowed, float("-inf"))
    tokens = [0] * len(decoders)
    greedy = [b for b, d in enumerate(decoders) if d.sampling.temperature == 0]
    if greedy:
        for b, token in zip(greedy, torch.argmax(logits[greedy], dim=-1).tolist()):
            tokens[b] = token
    sampled = [b for b, d in enumerate(decoders) if d.sampling.temperature != 0]
    if sampled:
        probs = _legacy_probabilities(logits[sampled], [decoders[b].sampling for b in sampled])
        noise = torch.empty_like(probs)
        for row, b in zip(noise, sampled):
            row.exponential_(generator=decoders[b].generator)
        for b, token in zip(sampled, torch.argmax(probs / noise, dim=-1).tolist()):
            tokens[b] = token
    return tokens


def _legacy_probabilities(logits: torch.Tensor, samplings: list[Any]) -> torch.Tensor:
    logits = logits / _per_row([s.temperature for s in samplings])
    for b, s in enumerate(samplings):
        if s.top_k and 0 < s.top_k < logits.shape[1]:
            kth = torch.topk(logits[b], s.top_k).values[-1]
            logits[b] = logits[b].masked_fill(logits[b] < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    nucleus = [b for b, s in enumerate(samplings) if s.top_p < 1.0]
    if nucleus:
        rows = probs[nucleus]
        sorted_probs, order = torch.sort(rows, dim=-1, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        top_p = _per_row([samplings[b].top_p for b in nucleus])
        sorted_probs[cumulative - sorted_probs > top_p] = 0.0
        probs[nucleus] = torch.zeros_like(rows).scatter_(1, order, sorted_probs)
    return probs


def _per_row(values: list[float]) -> float | torch.Tensor:
    if all(v == values[0] for v in values):
        return values[0]
    return torch.tensor(values, dtype=torch.float32).view(-1, 1)


# ---------------------------------------------------------------- measuring


class _Ops(TorchDispatchMode):
    """Counts the aten ops dispatched while active (what the 2,815 figure counted; compiled
    code does not run under a dispatch mode, so the compiled arm is counted by `_Profiled`)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


class _Profiled:
    """Counts the top-level aten ops the profiler records (ops called from Python or from
    compiled code, not the ops they call in turn)."""

    def __init__(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        self.count = 0
        self._profile = profile(activities=[ProfilerActivity.CPU])

    def __enter__(self) -> _Profiled:
        self._profile.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._profile.__exit__(*exc)
        events = [e for e in self._profile.events() if e.name.startswith("aten::")]
        self.count += sum(1 for e in events if e.cpu_parent is None
                          or not e.cpu_parent.name.startswith("aten::"))


ARMS = {"before": dict(static_decode=False, legacy=True),
        "sampler": dict(static_decode=False, legacy=False),
        "after": dict(static_decode=True, legacy=False),
        "compiled": dict(static_decode=True, legacy=False, compile_decode=True),
        # captured steps: on the CPU a replay reruns the step (no speed-up; graphs.py)
        "graphs": dict(static_decode=True, legacy=False, cuda_graphs=True)}


class DecodeBench:
    """One engine per arm; `measure` runs `batch` sessions on one frame each."""

    def __init__(self, model_path: Path, arm: str, frame: bytes, max_tokens: int,
                 stage: dict[str, Any] | None = None) -> None:
        """`stage`: more reasoner stage settings (e.g. `device`, `fp8_compute`)."""
        from worldserve.config import ReasonerStageConfig, ServerConfig, StreamingConfig
        from worldserve.engines.reasoner.engine import ReasonerEngine

        spec = {**ARMS[arm], **(stage or {})}
        self.legacy = spec.pop("legacy")
        stage = ReasonerStageConfig(model_path=model_path, streaming=StreamingConfig(
            max_sessions=4), **spec)
        self.engine = ReasonerEngine(stage, ServerConfig())
        self.frame, self.max_tokens = frame, max_tokens
        self.runs = 0

    @contextlib.contextmanager
    def _sampler(self) -> Iterator[None]:
        from worldserve.engines.reasoner import execute

        original = execute.sample_rows
        if self.legacy:
            execute.sample_rows = legacy_sample_rows
        try:
            yield
        finally:
            execute.sample_rows = original

    def measure(self, batch: int, counter: type | None = None) -> dict:
        """Decode-step wall time and rows (and ops, counted by `counter`) of `batch` sessions'
        replies."""
        from worldserve.ipc.messages import CloseSession, CreateSession, SessionFrame

        engine, steps = self.engine, self.engine.steps
        stats = {"s": 0.0, "steps": 0, "rows": 0, "ops": 0}
        decode = steps.decode

        def timed(rows: list) -> list[int]:
            mode = counter() if counter is not None else contextlib.nullcontext()
            start = time.perf_counter()
            with mode:
                out = decode(rows)
            stats["s"] += time.perf_counter() - start
            stats["steps"] += 1
            stats["rows"] += len(rows)
            stats["ops"] += mode.count if counter is not None else 0
            return out

        self.runs += 1
        sids = [f"r{self.runs}-{k}" for k in range(batch)]
        retention = engine.capabilities().retention
        for k, sid in enumerate(sids):
            engine.submit(CreateSession(
                request_id=f"c-{sid}", session_id=sid, system_prompt="Describe.", question="",
                retention=retention, sampling=_sampling(self.max_tokens, k)), lambda _: None)
        replies: list = []
        steps.decode = timed
        try:
            with self._sampler():
                for sid in sids:
                    engine.submit(SessionFrame(request_id=f"f-{sid}", session_id=sid,
                                               image=self.frame, received_at=time.time()),
                                  replies.append)
                while engine.has_work():
                    engine.step()
        finally:
            del steps.decode  # back to the method
        tokens = [list(engine.sessions[sid].segments[-1].ids) for sid in sids]
        for sid in sids:
            engine.submit(CloseSession(request_id=f"x-{sid}", session_id=sid), lambda _: None)
        return {**stats, "tokens": tokens}


def _sampling(max_tokens: int, k: int) -> Any:
    from worldserve.ipc.messages import ReasonerSampling

    return ReasonerSampling(max_tokens=max_tokens, seed=100 + k)  # server default knobs


def part_decode(model_path: Path, frame: bytes, arms: list[str], max_tokens: int,
                repeats: int) -> dict:
    """Ops per decode step and ms per step / token of each arm at batch 1 and 4."""
    benches = {arm: DecodeBench(model_path, arm, frame, max_tokens) for arm in arms}
    reference: dict[int, list] = {}
    ops: dict[tuple[str, int], float | None] = {}
    profiled: dict[tuple[str, int], float] = {}
    times: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for arm, bench in benches.items():  # warm-up (compiles), counts and the token check
        for batch in (1, 4):
            bench.measure(batch)
            got = bench.measure(batch, _Ops) if arm != "compiled" else None
            ops[(arm, batch)] = got["ops"] / max(got["steps"], 1) if got else None
            seen = bench.measure(batch, _Profiled)
            profiled[(arm, batch)] = seen["ops"] / max(seen["steps"], 1)
            assert reference.setdefault(batch, seen["tokens"]) == seen["tokens"], arm
    for _ in range(repeats):
        for arm, bench in benches.items():
            for batch in (1, 4):
                got = bench.measure(batch)
                times.setdefault((arm, batch), []).append(
                    (got["s"] * 1000 / got["steps"], got["s"] * 1000 / got["rows"]))
    out: dict = {"part": "decode", "layers": NANO_LAYERS, "vocab": NANO_VOCAB,
                 "repeats": repeats, "arms": {}}
    for (arm, batch), runs in times.items():
        step_ms = statistics.median(r[0] for r in runs)
        token_ms = statistics.median(r[1] for r in runs)
        dispatched = ops[(arm, batch)]
        out["arms"].setdefault(arm, {})[f"b{batch}"] = {
            "ops_per_step": round(dispatched) if dispatched is not None else None,
            "profiled_ops_per_step": round(profiled[(arm, batch)]),
            "ms_per_step": round(step_ms, 2), "ms_per_token": round(token_ms, 2)}
    for arm in arms:
        if arm == "before":
            continue
        for batch in ("b1", "b4"):
            now, was = out["arms"][arm][batch], out["arms"]["before"][batch]
            now["ms_per_token_vs_before"] = round(now["ms_per_token"] / was["ms_per_token"], 3)
            now["profiled_ops_vs_before"] = round(
                now["profiled_ops_per_step"] / was["profiled_ops_per_step"], 3)
            if now["ops_per_step"] is not None:
                now["ops_vs_before"] = round(now["ops_per_step"] / was["ops_per_step"], 3)
    return out
