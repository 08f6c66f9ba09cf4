"""Reasoner engine benchmark: session KV reuse vs re-sending the window, flatness, concurrency.

Drives the `hf` reasoner engine in-process (the stage loop's submit/step calls, no sockets), on
one model and one set of frames:

1. per-frame TTFT and latency of a session (KV cache kept, only the new frame prefilled) vs a
   naive client that re-sends the whole retained window (anchor frame + last 8 frames and the
   replies) as a fresh chat completion every frame;
2. flatness over a long session: p95 latency of the last 100 frames / p95 of frames 10-110;
3. aggregate frames/s with 1, 2 and 4 concurrent sessions;
4. (`--parts decode`, on its own) the decode step at Nano depth, before and after it left the
   host: ops dispatched per step and ms per token (`benchmarks/reasoner_decode.py`).

    python benchmarks/reasoner.py [--model qwen-vl|cosmos3|cosmos3-edge] [--model-path DIR]
                                  [--flat-frames 1000] [--profile] [--batch-ab]
                                  [--parts window,flatness,concurrency,decode] [--compile]
                                  [--spec none|ngram|dflash [--spec-model-path DRAFTER]]
    python benchmarks/reasoner.py --spec-compare [--model ...]

`--model` picks a dev checkpoint (built on first use); `--profile` runs the 4-session part
again under cProfile and prints where the time goes; `--batch-ab` runs the 1- and 4-session
parts with the batching of before (decode caches re-packed every step, one sampling call per
sequence, one forward per frame's prefill) and the current one (caches kept packed, one
sampling call per batch, frames arriving together prefilled in one forward), interleaved, and
prints both fps_4 / fps_1 ratios. Frames/s are wall-clock; `cpu_fps` (frames
per second of this process's CPU time) is printed too, steadier on a shared machine.
`--spec-compare` runs only a speculation comparison: one session decoding the same frames
with no speculation, n-gram and DFlash (a seeded random drafter matched to the model unless
`--spec-model-path`), printing accepted tokens per drafting step, tokens per decode forward
and the decode speed-up of each method.

Prints one JSON line per part and a final summary line.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402
from benchmarks.harness import p95  # noqa: E402
from worldserve import envs  # noqa: E402
from worldserve.config import ReasonerStageConfig, ServerConfig, StreamingConfig  # noqa: E402
from worldserve.ipc.messages import (  # noqa: E402
    ChatCompletion,
    ChatDelta,
    ChatMessage,
    ChatPart,
    CreateSession,
    ErrorReply,
    ReasonerSampling,
    SessionFrame,
)

SYSTEM = "Describe each frame in one short sentence; flag anything hazardous."
QUESTION = "What is happening in this feed?"
# Greedy decoding of the random dev model emits only special tokens (empty text, so no TTFT);
# seeded sampling gives text. Both paths use the same settings.
SAMPLING = dict(temperature=1.0, top_p=1.0, seed=1234)


def make_frames(count: int, size: int) -> list[bytes]:
    frames = []
    y, x = np.mgrid[0:size, 0:size]
    for i in range(count):
        img = np.stack([(x + 7 * i) % 256, (y + 3 * i) % 256, (x + y + 11 * i) % 256], -1)
        buf = io.BytesIO()
        Image.fromarray(img.astype(np.uint8)).save(buf, format="JPEG", quality=85)
        frames.append(buf.getvalue())
    return frames


class Bench:
    def __init__(self, model_path: Path, spec: str, max_sessions: int = 4,
                 spec_model_path: Path | None = None) -> None:
        from worldserve.engines.reasoner.engine import ReasonerEngine

        stage = ReasonerStageConfig(model_path=model_path, streaming=StreamingConfig(
            max_sessions=max_sessions, spec_method=spec, spec_model_path=spec_model_path))
        self.engine = ReasonerEngine(stage, ServerConfig())
        self.retention = self.engine.capabilities().retention
        self._seq = 0

    def rid(self) -> str:
        self._seq += 1
        return f"r{self._seq}"

    def run(self) -> None:
        while self.engine.has_work():
            self.engine.step()

    def create(self, sid: str, max_tokens: int) -> None:
        out: list = []
        self.engine.submit(CreateSession(
            request_id=self.rid(), session_id=sid, system_prompt=SYSTEM, question=QUESTION,
            retention=self.retention,
            sampling=ReasonerSampling(max_tokens=max_tokens, **SAMPLING)), out.append)
        if isinstance(out[0], ErrorReply):
            raise RuntimeError(out[0].message)

    def session_frames(self, sid: str, frames: list[bytes]) -> list:
        results = []
        for image in frames:
            out: list = []
            self.engine.submit(SessionFrame(request_id=self.rid(), session_id=sid, image=image,
                                            received_at=time.time()), out.append)
            self.run()
            if isinstance(out[-1], ErrorReply):
                raise RuntimeError(out[-1].message)
            results.append(out[-1])
        return results

    def naive_frame(self, history: list[tuple[bytes, str]], image: bytes, anchor: bytes,
                    window: int, max_tokens: int) -> tuple[float, float, str]:
        """Re-send system + anchor frame + the last `window` frames with their replies."""
        msgs = [ChatMessage(role="system", parts=[ChatPart(type="text", text=SYSTEM)]),
                ChatMessage(role="user", parts=[ChatPart(type="image", image=anchor),
                                                ChatPart(type="text", text=QUESTION)])]
        recent = history[1:][-(window - 1):] if window > 1 else []
        if history:
            msgs.append(ChatMessage(role="assistant",
                                    parts=[ChatPart(type="text", text=history[0][1])]))
        for past_image, past_reply in recent:
            msgs.append(ChatMessage(role="user", parts=[ChatPart(type="image", image=past_image)]))
            msgs.append(ChatMessage(role="assistant", parts=[ChatPart(type="text",
                                                                      text=past_reply)]))
        if history:
            msgs.append(ChatMessage(role="user", parts=[ChatPart(type="image", image=image)]))
        out: list = []
        start = time.time()
        first: list[float] = []

        def reply(msg) -> None:
            if isinstance(msg, ChatDelta) and not first and msg.text.strip():
                first.append(time.time())
            out.append(msg)

        self.engine.submit(ChatCompletion(
            request_id=self.rid(), messages=msgs, stream=True,
            sampling=ReasonerSampling(max_tokens=max_tokens, **SAMPLING)), reply)
        self.run()
        end = time.time()
        text = out[-1].text
        return (first[0] if first else end) - start, end - start, text


def part_window(bench: Bench, frames: list[bytes], num_frames: int, window: int,
                max_tokens: int) -> dict:
    bench.create("w", max_tokens)
    session = bench.session_frames("w", frames[:num_frames])
    bench.engine.submit(_close("w"), lambda _: None)
    history: list[tuple[bytes, str]] = []
    naive = []
    for i in range(num_frames):
        naive.append(bench.naive_frame(history, frames[i], frames[0], window, max_tokens))
        history.append((frames[i], naive[-1][2]))
    steady = slice(window + 2, num_frames)  # once the window is full
    s_ttft = statistics.mean(r.ttft_s or r.latency_s for r in session[steady])
    s_lat = statistics.mean(r.latency_s for r in session[steady])
    n_ttft = statistics.mean(t for t, _, _ in naive[steady])
    n_lat = statistics.mean(lat for _, lat, _ in naive[steady])
    return {"part": "window", "window": window, "frames": num_frames,
            "session_ttft_ms": s_ttft * 1000, "session_latency_ms": s_lat * 1000,
            "naive_ttft_ms": n_ttft * 1000, "naive_latency_ms": n_lat * 1000,
            "naive_over_session_ttft": n_ttft / s_ttft,
            "naive_over_session_latency": n_lat / s_lat}


def part_flatness(bench: Bench, frames: list[bytes], num_frames: int, max_tokens: int) -> dict:
    bench.create("flat", max_tokens)
    looped = [frames[i % len(frames)] for i in range(num_frames)]
    results = bench.session_frames("flat", looped)
    bench.engine.submit(_close("flat"), lambda _: None)
    lat = [r.latency_s for r in results]
    early = lat[10:110]
    late = lat[-100:]
    return {"part": "flatness", "frames": num_frames, "p95_early_ms": p95(early) * 1000,
            "p95_late_ms": p95(late) * 1000, "flatness": p95(late) / p95(early),
            "p50_early_ms": statistics.median(early) * 1000,
            "p50_late_ms": statistics.median(late) * 1000,
            "session_tokens_frame_60": results[60].session_tokens if num_frames > 60 else None,
            "reprefills": sum(r.reprefill_ms is not None for r in results),
            "max_session_tokens_seen": max(r.session_tokens for r in results)}


def part_concurrency(bench: Bench, frames: list[bytes], num_sessions: int, per_session: int,
                     max_tokens: int, cpu: list[float] | None = None) -> float:
    """Aggregate frames/s (wall clock) of `num_sessions` sessions, each sending its next frame
    when the previous reply arrives; `cpu` (if given) receives frames per CPU second."""
    sids = [f"c{num_sessions}-{k}" for k in range(num_sessions)]
    for sid in sids:
        bench.create(sid, max_tokens)
    sent = {sid: 0 for sid in sids}
    done = 0
    inbox: list = []

    def send(sid: str) -> None:
        image = frames[(sent[sid] * 3 + sids.index(sid)) % len(frames)]
        bench.engine.submit(SessionFrame(request_id=f"{sid}:{sent[sid]}", session_id=sid,
                                         image=image, received_at=time.time()), inbox.append)
        sent[sid] += 1

    start, cpu_start = time.perf_counter(), time.process_time()
    for sid in sids:
        send(sid)
    while done < num_sessions * per_session:
        bench.engine.step()
        while inbox:
            msg = inbox.pop()
            if isinstance(msg, ErrorReply):
                raise RuntimeError(msg.message)
            done += 1
            sid = msg.request_id.split(":")[0]
            if sent[sid] < per_session:
                send(sid)
    elapsed = time.perf_counter() - start
    if cpu is not None:
        cpu.append(num_sessions * per_session / (time.process_time() - cpu_start))
    for sid in sids:
        bench.engine.submit(_close(sid), lambda _: None)
    return num_sessions * per_session / elapsed


def dev_model_path(model: str) -> Path:
    """The dev checkpoint of `--model` (built into the dev cache when missing)."""
    from worldserve.models.dev import BUILDERS, build_dev_models

    root = envs.dev_models_dir()
    if model == "cosmos3-edge":
        from worldserve.models.cosmos3_reasoner.dev import build_edge

        target = root / "bench-cosmos3-edge"
        if not (target / "config.json").is_file():
            target.mkdir(parents=True, exist_ok=True)
            build_edge(target, 0)
        return target
    name = {"qwen-vl": "reasoner", "cosmos3": "cosmos3-reasoner"}[model]
    if not (root / name / "worldserve_dev.json").is_file():
        build_dev_models(root)
    assert name in BUILDERS
    return root / name


def bench_drafter_path(model_path: Path) -> Path:
    """A seeded random DFlash drafter matched to `model_path` (written on first use)."""
    from worldserve.models.dflash.dev import write_drafter_for

    target = envs.dev_models_dir() / f"bench-drafter-{model_path.name}"
    if not (target / "config.json").is_file():
        target.mkdir(parents=True, exist_ok=True)
        write_drafter_for(target, 0, model_path)
    return target


def _session_decode(bench: Bench, sid: str, frames: list[bytes], max_tokens: int) -> dict:
    """One session over `frames`: wall time, reply tokens and target forwards."""
    extra0 = dict(bench.engine.stats()["extra"])
    bench.create(sid, max_tokens)
    start = time.perf_counter()
    results = bench.session_frames(sid, frames)
    elapsed = time.perf_counter() - start
    replies = [t for seg in bench.engine.sessions[sid].segments
               if seg.kind == "assistant_text" for t in seg.ids]  # the retained replies
    bench.engine.submit(_close(sid), lambda _: None)
    extra = bench.engine.stats()["extra"]
    return {"s": elapsed, "tokens": sum(r.token_count for r in results), "replies": replies,
            "forwards": extra["forwards"] - extra0["forwards"],
            **{k: extra[k] - extra0.get(k, 0) for k in ("spec_drafted", "spec_accepted",
                                                         "spec_steps") if k in extra}}


SPEC_REPEATS = 3


def part_spec(model_path: Path, method: str, frames: list[bytes], max_tokens: int,
              drafter: Path | None, label: str | None = None) -> dict:
    """Decode cost of one speculation method: a session run with `max_tokens` minus the same
    frames with max_tokens 1 (prefill + first token) leaves the decode steps."""
    bench = Bench(model_path, method, spec_model_path=drafter if method == "dflash" else None)
    _session_decode(bench, "warm", frames[:2], max_tokens)
    full = _session_decode(bench, "full", frames, max_tokens)
    first = _session_decode(bench, "first", frames, 1)
    for k in range(SPEC_REPEATS - 1):  # the fastest of a few runs: less noise from other load
        full["s"] = min(full["s"], _session_decode(bench, f"full{k}", frames, max_tokens)["s"])
        first["s"] = min(first["s"], _session_decode(bench, f"first{k}", frames, 1)["s"])
    decoded = full["tokens"] - len(frames)  # tokens after each reply's first
    steps = full["forwards"] - first["forwards"]  # decode forwards (prefill is the same)
    out = {"part": "spec", "method": label or method, "frames": len(frames),
           "decoded_tokens": decoded, "replies": full["replies"],
           "decode_forwards": steps, "tokens_per_decode_forward": decoded / max(steps, 1),
           "decode_ms_per_token": (full["s"] - first["s"]) * 1000 / max(decoded, 1)}
    if "spec_steps" in full:
        out["drafted"], out["accepted"] = full["spec_drafted"], full["spec_accepted"]
        out["accepted_per_step"] = full["spec_accepted"] / max(full["spec_steps"], 1)
    return out


def constant_drafter_path(model_path: Path, replies: list[int]) -> Path:
    """The upper-bound drafter: it always drafts the most frequent token of `replies`."""
    import tempfile

    from transformers import AutoModelForImageTextToText

    from worldserve.models.dflash.dev import write_constant_drafter

    token = max(set(replies), key=replies.count)
    target = Path(tempfile.mkdtemp(prefix="bench-constant-drafter-"))
    model = AutoModelForImageTextToText.from_pretrained(model_path)
    write_constant_drafter(target, 0, model_path, model, token)
    return target


def compare_spec(model_path: Path, frames: list[bytes], max_tokens: int,
                 drafter: Path | None, upper_bound: bool = False) -> dict:
    drafter = drafter or bench_drafter_path(model_path)
    parts = {}
    for method in ("none", "ngram", "dflash"):
        parts[method] = part_spec(model_path, method, frames, max_tokens, drafter)
    if upper_bound:
        constant = constant_drafter_path(model_path, parts["none"]["replies"])
        parts["dflash-constant"] = part_spec(model_path, "dflash", frames, max_tokens,
                                             constant, label="dflash-constant")
        shutil.rmtree(constant, ignore_errors=True)
    reference = parts["none"]["replies"]
    for part in parts.values():
        assert part.pop("replies") == reference  # lossless, here too
        print(json.dumps(part), flush=True)
    cost = {m: p["decode_ms_per_token"] for m, p in parts.items()}
    bound = {"constant_accepted_per_step": round(parts["dflash-constant"]["accepted_per_step"], 3),
             "constant_speedup_vs_none": round(cost["none"] / cost["dflash-constant"], 3)
             } if upper_bound else {}
    return {**bound, "model": str(model_path), "drafter": str(drafter),
            "dflash_accepted_per_step": round(parts["dflash"].get("accepted_per_step", 0.0), 3),
            "ngram_accepted_per_step": round(parts["ngram"].get("accepted_per_step", 0.0), 3),
            "ngram_speedup_vs_none": round(cost["none"] / cost["ngram"], 3),
            "dflash_speedup_vs_none": round(cost["none"] / cost["dflash"], 3),
            "dflash_speedup_vs_ngram": round(cost["ngram"] / cost["dflash"], 3)}


def profile_concurrency(bench: Bench, frames: list[bytes], per_session: int, max_tokens: int,
                        top: int = 12) -> dict:
    """Where the 4-session time goes: the functions with the most cumulative time."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    part_concurrency(bench, frames, 4, per_session, max_tokens)
    profiler.disable()
    stats = pstats.Stats(profiler)
    total = stats.total_tt
    rows = []
    for (path, line, func), (_, calls, tottime, cumtime, _) in stats.stats.items():
        rows.append({"function": f"{Path(path).name}:{line}:{func}", "calls": calls,
                     "self_s": round(tottime, 3), "cum_s": round(cumtime, 3),
                     "cum_share": round(cumtime / total, 3) if total else 0.0})
    by_cum = sorted(rows, key=lambda r: r["cum_s"], reverse=True)[:top]
    by_self = sorted(rows, key=lambda r: r["self_s"], reverse=True)[:top]
    return {"total_s": round(total, 3), "by_cumulative": by_cum, "by_self": by_self}


def batching_of_before(bench: Bench):
    """Context manager: the batching of before, for A/B runs — decode caches re-packed into a
    new batch every step, one sampling call per sequence, one forward per frame's prefill."""
    import contextlib

    from worldserve.engines.reasoner import execute
    from worldserve.models.qwen_vl import batch as batch_module

    @contextlib.contextmanager
    def swapped():
        runner, sample_rows = bench.engine.runner, execute.sample_rows
        runner.forward_decode_batch = (
            lambda kvs, fed: batch_module.forward_repacked(runner, kvs, fed))
        runner.forward_prefill_batch = lambda kvs, ids, media: [
            runner.forward(kv, chunk, items)[-1] for kv, chunk, items in zip(kvs, ids, media)]
        execute.sample_rows = lambda decoders, logits: [
            sample_rows([d], row[None])[0] for d, row in zip(decoders, logits)]
        try:
            yield
        finally:
            del runner.forward_decode_batch, runner.forward_prefill_batch  # the class methods
            execute.sample_rows = sample_rows

    return swapped()


def batch_ab(bench: Bench, frames: list[bytes], per_session: int, max_tokens: int,
             repeats: int) -> dict:
    """fps_4 / fps_1 with the batching of before and the current one, interleaved `repeats`
    times (medians), in one process on one model."""
    import contextlib

    runs: dict[str, dict[str, list[float]]] = {}
    for _ in range(repeats):
        for name in ("before", "now"):
            ctx = batching_of_before(bench) if name == "before" else contextlib.nullcontext()
            got = runs.setdefault(name, {"fps_1": [], "fps_4": [], "cpu_fps_1": [],
                                         "cpu_fps_4": []})
            with ctx:
                for n in (1, 4):
                    cpu: list[float] = []
                    got[f"fps_{n}"].append(part_concurrency(bench, frames, n, per_session,
                                                            max_tokens, cpu))
                    got[f"cpu_fps_{n}"].append(cpu[0])
    out: dict = {"part": "batch_ab", "repeats": repeats}
    # one session never batches: both arms run the same code there, so their 1-session runs
    # pool into one steadier denominator
    pooled_1 = statistics.median(runs["before"]["fps_1"] + runs["now"]["fps_1"])
    for name, got in runs.items():
        med = {k: statistics.median(v) for k, v in got.items()}
        out[name] = {**{k: round(v, 2) for k, v in med.items()},
                     "ratio_4_over_1": round(med["fps_4"] / med["fps_1"], 3),
                     "cpu_ratio_4_over_1": round(med["cpu_fps_4"] / med["cpu_fps_1"], 3),
                     "ratio_4_over_pooled_1": round(med["fps_4"] / pooled_1, 3)}
    out["fps_4_now_over_before"] = round(out["now"]["fps_4"] / out["before"]["fps_4"], 3)
    out["cpu_fps_4_now_over_before"] = round(
        out["now"]["cpu_fps_4"] / out["before"]["cpu_fps_4"], 3)
    return out


def _close(sid: str):
    from worldserve.ipc.messages import CloseSession

    return CloseSession(request_id=f"close-{sid}", session_id=sid)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["qwen-vl", "cosmos3", "cosmos3-edge"],
                        default="qwen-vl", help="dev checkpoint (ignored with --model-path)")
    parser.add_argument("--model-path", type=Path, default=None)
    parser.add_argument("--profile", action="store_true",
                        help="profile the 4-session part (cProfile, top functions)")
    parser.add_argument("--parts", default="window,flatness,concurrency",
                        help="comma-separated parts to run")
    parser.add_argument("--batch-ab", action="store_true",
                        help="fps_4 / fps_1 with the batching of before vs now")
    parser.add_argument("--ab-repeats", type=int, default=3)
    parser.add_argument("--frame-size", type=int, default=224)
    parser.add_argument("--window-frames", type=int, default=40)
    parser.add_argument("--flat-frames", type=int, default=1000)
    parser.add_argument("--flat-max-tokens", type=int, default=8)
    parser.add_argument("--per-session", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--spec", choices=["none", "ngram", "dflash"], default="none")
    parser.add_argument("--spec-model-path", type=Path, default=None,
                        help="DFlash drafter (default: a seeded random one matched to the model)")
    parser.add_argument("--spec-compare", action="store_true",
                        help="only compare decoding with none / ngram / dflash speculation")
    parser.add_argument("--spec-frames", type=int, default=12)
    parser.add_argument("--spec-upper-bound", action="store_true",
                        help="with --spec-compare: also DFlash with a hand-set drafter that "
                             "always drafts the model's most frequent reply token")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--compile", action="store_true",
                        help="with --parts decode: also the static step under torch.compile")
    parser.add_argument("--graphs", action="store_true",
                        help="with --parts decode: also the static step captured and replayed "
                             "(cuda_graphs; on the CPU a replay reruns the step)")
    parser.add_argument("--decode-repeats", type=int, default=3)
    parser.add_argument("--decode-max-tokens", type=int, default=24)
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="0 = greedy (the dev model then emits no text: TTFT falls back to "
                             "latency)")
    args = parser.parse_args()
    if args.batch_ab and args.spec == "dflash":
        parser.error("--batch-ab compares the plain runner's batching: drop --spec dflash")

    import torch

    torch.set_num_threads(args.threads)
    SAMPLING["temperature"] = args.temperature
    frames = make_frames(40, args.frame_size)
    parts = set(args.parts.split(","))
    if "decode" in parts:  # on its own model: the Omni dev reasoner at Nano depth
        from benchmarks.reasoner_decode import nano_model_path, part_decode

        arms = (["before", "sampler", "after"] + (["compiled"] if args.compile else [])
                + (["graphs"] if args.graphs else []))
        decode = part_decode(args.model_path or nano_model_path(envs.dev_models_dir()),
                             frames[0], arms, args.decode_max_tokens, args.decode_repeats)
        print(json.dumps(decode), flush=True)
        if parts == {"decode"}:
            return
    model_path = args.model_path or dev_model_path(args.model)
    if args.spec_compare:
        print(json.dumps(compare_spec(model_path, frames[:args.spec_frames], args.max_tokens,
                                      args.spec_model_path, args.spec_upper_bound)))
        return
    drafter = args.spec_model_path or (bench_drafter_path(model_path)
                                       if args.spec == "dflash" else None)
    bench = Bench(model_path, args.spec, spec_model_path=drafter)
    summary: dict[str, float | str] = {"model": str(model_path)}
    if "window" in parts:
        window = part_window(bench, frames, args.window_frames, 8, args.max_tokens)
        print(json.dumps(window), flush=True)
        summary["naive_over_session_ttft_w8"] = round(window["naive_over_session_ttft"], 2)
    if "flatness" in parts:
        flat = part_flatness(bench, frames, args.flat_frames, args.flat_max_tokens)
        print(json.dumps(flat), flush=True)
        summary["flatness_1000"] = round(flat["flatness"], 3)
    if "concurrency" in parts:
        for n in (1, 2, 4):
            cpu: list[float] = []
            fps = part_concurrency(bench, frames, n, args.per_session, args.max_tokens, cpu)
            print(json.dumps({"part": "concurrency", "sessions": n, "fps": fps,
                              "cpu_fps": cpu[0]}), flush=True)
            summary[f"fps_{n}"], summary[f"cpu_fps_{n}"] = round(fps, 2), round(cpu[0], 2)
        summary["fps_4_over_1"] = round(summary["fps_4"] / summary["fps_1"], 3)
        summary["cpu_fps_4_over_1"] = round(summary["cpu_fps_4"] / summary["cpu_fps_1"], 3)
    if args.batch_ab:
        ab = batch_ab(bench, frames, args.per_session, args.max_tokens, args.ab_repeats)
        print(json.dumps(ab), flush=True)
        summary["batch_ab_ratio_before"] = ab["before"]["ratio_4_over_1"]
        summary["batch_ab_ratio_now"] = ab["now"]["ratio_4_over_1"]
    if args.profile:
        profile = profile_concurrency(bench, frames, args.per_session, args.max_tokens)
        print(json.dumps({"part": "profile", "sessions": 4, **profile}), flush=True)
    extra = bench.engine.stats()["extra"]
    if "spec_drafted" in extra:
        print(json.dumps({"part": "speculation", "drafted": extra["spec_drafted"],
                          "accepted": extra["spec_accepted"],
                          "steps": extra["spec_steps"]}), flush=True)
    harness.emit(summary)


if __name__ == "__main__":
    main()
